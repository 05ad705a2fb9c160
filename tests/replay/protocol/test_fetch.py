"""replay.protocol.fetch: a prover's URL fetches its transcript and nothing else, within bounds, saying only what failed."""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay import Budget, verify
from replay.__main__ import main
from replay.protocol.fetch import FetchRefused, fetch_transcript, named_files
from replay.protocol.pinned_http import forbidden

from ..helpers import manifest

LOOPBACK = frozenset({"127.0.0.1"})
SECRET = "INTERNAL-ANSWER-3f9a"


class Server:
    """A local http server over a directory; ``routes`` override paths (status, headers, body); requests are counted."""

    def __init__(self, directory: Path):
        self.requests: list[str] = []
        self.routes: dict[str, tuple[int, dict, bytes]] = {}
        self.release = threading.Event()
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append(self.path)
                route = server.routes.get(self.path)
                if route == "hang":
                    server.release.wait(10)
                    return
                if route is None:
                    return super().do_GET()
                status, headers, body = route
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/run/"
        self.routes_prefix = "/run/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(transcripts, tmp_path):
    """The honest tiny MLP transcript served at http://127.0.0.1:PORT/run/."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "run").symlink_to(transcripts["mlp", "det64"], target_is_directory=True)
    server = Server(tmp_path / "www")
    yield server
    server.close()


def resolve(monkeypatch, port: int, answers: dict[str, list[str]]) -> None:
    """DNS as the test says for the names in ``answers``; real DNS for the rest."""
    real = socket.getaddrinfo

    def fake(host, *args, **kw):
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def fetch(url, dest, **kw):
    args = {"max_bytes": 64 << 20, "max_files": 100, "deadline_s": 30.0, "allowed_hosts": LOOPBACK, **kw}
    return fetch_transcript(url, dest, **args)


def test_an_honest_transcript_over_http_verifies(served, transcripts, tmp_path):
    got = fetch(served.url, tmp_path / "got")
    honest = transcripts["mlp", "det64"]
    names = ["manifest.json", *named_files(manifest(honest))]
    assert sorted(str(p.relative_to(got)) for p in got.rglob("*") if p.is_file()) == sorted(names)
    assert len(served.requests) == len(names)
    v = verify(got, honest / "claims.json", Budget(segments=100))
    assert v.verdict == "verified", v.reasons


def test_a_transcript_beyond_this_verifiers_budget_over_http_is_its_error(served, transcripts, monkeypatch, capsys):
    """The verdict "error" naming the budget (retried, for a larger worker), not "malformed" (final: the prover
    blamed for this machine's size)."""
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", "1000")
    claims = str(transcripts["mlp", "det64"] / "claims.json")
    assert main(["verify", served.url, "--claims", claims, "--allow-host", "127.0.0.1", "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "error" and "REPLAY_MEMORY_BUDGET_BYTES" in out["reasons"][0], out["reasons"]
    assert out["beyond_budget"] is True


def test_the_environment_tightens_the_callers_caps(served, tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAY_FETCH_MAX_FILES", "2")
    with pytest.raises(FetchRefused, match="more than the 2 allowed"):
        fetch(served.url, tmp_path / "a", max_files=100_000)
    monkeypatch.setenv("REPLAY_FETCH_MAX_FILES", "1000")  # never loosens
    with pytest.raises(FetchRefused, match="more than the 3 allowed"):
        fetch(served.url, tmp_path / "b", max_files=3)
    monkeypatch.setenv("REPLAY_FETCH_MAX_BYTES", "nan")
    with pytest.raises(FetchRefused, match="not a number"):
        fetch(served.url, tmp_path / "c")


def test_loopback_is_refused_unless_allowed(served, tmp_path):
    with pytest.raises(FetchRefused, match="loopback"):
        fetch(served.url, tmp_path / "got", allowed_hosts=frozenset())
    assert served.requests == [], "no connection at all to a refused address"


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/run/manifest.json",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:{port}/run/manifest.json",
        "http://10.1.2.3/manifest.json",
        "http://[::ffff:127.0.0.1]:{port}/run/manifest.json",
        "http://localhost:{port}/run/manifest.json",
        "http://0.0.0.0:{port}/run/manifest.json",
    ],
)
def test_a_redirect_to_an_internal_address_is_refused(served, tmp_path, target, monkeypatch):
    """The prover's server (prover.test, allowed here only as the test's stand-in for a public host) redirects inward."""
    port = served.httpd.server_address[1]
    resolve(monkeypatch, port, {"prover.test": ["127.0.0.1"]})
    served.routes["/run/manifest.json"] = (302, {"Location": target.format(port=port)}, b"")
    with pytest.raises(FetchRefused) as refused:
        fetch(f"http://prover.test:{port}/run/", tmp_path / "got", allowed_hosts=frozenset({"prover.test"}))
    assert "never fetched" in refused.value.reason
    assert served.requests == ["/run/manifest.json"], "the redirect target was not requested"


def test_a_redirect_to_another_scheme_is_refused(served, tmp_path):
    served.routes["/run/manifest.json"] = (301, {"Location": "file:///etc/passwd"}, b"")
    with pytest.raises(FetchRefused, match="scheme"):
        fetch(served.url, tmp_path / "got")


def test_redirect_chains_are_bounded(served, tmp_path):
    served.routes["/run/manifest.json"] = (302, {"Location": "/run/manifest.json"}, b"")
    with pytest.raises(FetchRefused, match="redirects"):
        fetch(served.url, tmp_path / "got")
    assert len(served.requests) == 4


def test_an_allowed_redirect_is_followed(served, tmp_path):
    served.routes["/elsewhere/manifest.json"] = (307, {"Location": served.url + "manifest.json"}, b"")
    with pytest.raises(FetchRefused, match=r"checkpoints/00000000\.safetensors: the transcript server answered HTTP"):
        fetch(served.url.replace("/run/", "/elsewhere/"), tmp_path / "got")
    assert served.requests[:3] == [
        "/elsewhere/manifest.json",
        "/run/manifest.json",
        "/elsewhere/checkpoints/00000000.safetensors",
    ]
    assert (tmp_path / "got" / "manifest.json").stat().st_size > 0


def test_every_resolved_address_is_checked_and_the_checked_one_is_connected(served, tmp_path, monkeypatch):
    port = served.httpd.server_address[1]
    resolve(monkeypatch, port, {"mixed.test": ["93.184.216.34", "10.0.0.7"], "pinned.test": ["127.0.0.1"]})
    with pytest.raises(FetchRefused, match="private"):
        fetch(f"http://mixed.test:{port}/run/", tmp_path / "a", allowed_hosts=frozenset())
    # an allowed name is connected at the address it resolved to, the Host header naming it
    got = fetch(f"http://pinned.test:{port}/run/", tmp_path / "b", allowed_hosts=frozenset({"pinned.test"}))
    assert (got / "manifest.json").read_bytes()


def test_too_many_files_are_refused_before_they_are_requested(served, tmp_path):
    with pytest.raises(FetchRefused, match="more than the 3 allowed"):
        fetch(served.url, tmp_path / "got", max_files=3)
    assert served.requests == ["/run/manifest.json"]


def test_oversize_is_refused(served, transcripts, tmp_path):
    size = (transcripts["mlp", "det64"] / "manifest.json").stat().st_size
    with pytest.raises(FetchRefused, match="bytes"):
        fetch(served.url, tmp_path / "a", max_bytes=size - 1)
    with pytest.raises(FetchRefused, match="bytes"):
        fetch(served.url, tmp_path / "b", max_bytes=size + 1000)
    # a server that lies about (or omits) Content-Length is cut off by counting
    big = b"[" * 5000
    served.routes["/run/manifest.json"] = (200, {"Content-Length": "1"}, big)
    with pytest.raises(FetchRefused):
        fetch(served.url, tmp_path / "c", max_bytes=100)


def test_the_deadline_bounds_a_server_that_never_answers(served, tmp_path):
    served.routes["/run/manifest.json"] = "hang"
    with pytest.raises(FetchRefused, match=r"longer than 0\.3 s"):
        fetch(served.url, tmp_path / "got", deadline_s=0.3)


@pytest.mark.parametrize("status", [200, 403, 500])
def test_errors_never_carry_what_the_server_answered(served, tmp_path, status):
    body = (SECRET + " root:x:0:0:root:/root:/bin/bash\n").encode()
    served.routes["/run/manifest.json"] = (status, {"X-Internal": SECRET}, body)
    with pytest.raises(FetchRefused) as refused:
        fetch(served.url, tmp_path / "got")
    assert SECRET not in str(refused.value) and "root:x" not in str(refused.value)
    assert "manifest.json" in str(refused.value)


def test_a_manifest_naming_thousands_of_files_issues_one_request(served, transcripts, tmp_path):
    m = manifest(transcripts["mlp", "det64"])
    m["checkpoint_interval"] = 1
    m["checkpoints"] = {str(s): "0" * 64 for s in range(m["steps"] + 1)}
    m["segments"] = {str(s): "0" * 64 for s in range(m["steps"])}
    data = json.dumps(m, sort_keys=True, separators=(",", ":")).encode()
    served.routes["/run/manifest.json"] = (200, {}, data)
    with pytest.raises(FetchRefused, match="names 26 files"):
        fetch(served.url, tmp_path / "got", max_files=10)
    assert served.requests == ["/run/manifest.json"]


def test_a_malformed_manifest_is_refused_with_the_parsers_reason(served, tmp_path):
    served.routes["/run/manifest.json"] = (200, {}, b'{"format": 1')
    with pytest.raises(FetchRefused, match=r"manifest\.json: manifest\.json is not JSON"):
        fetch(served.url, tmp_path / "got")


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/t/", "gopher://x/", "http:///nohost", "http://a b/", "x" * 3000]
)
def test_only_http_urls_are_fetched(url, tmp_path):
    with pytest.raises(FetchRefused):
        fetch(url, tmp_path / "got")


# --------------------------------------------------------------------------- the address check


@given(st.ip_addresses())
def test_forbidden_matches_the_address_kinds(ip):
    """Exactly the globally routable addresses pass, IPv4 also when wrapped in IPv4-mapped IPv6."""
    inner = ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped else ip
    if forbidden(str(ip)) is None:
        assert inner.is_global and not inner.is_multicast and not ip.is_private
    elif ip.version == 4:
        assert not ip.is_global or ip.is_multicast or ip.is_reserved
    if ip.version == 4 and forbidden(str(ip)):
        assert forbidden(f"::ffff:{ip}") is not None


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.0.9",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",
        "0.0.0.0",
        "224.0.0.1",
        "240.0.0.1",
        "::1",
        "::",
        "fe80::1%eth0",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::1",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    ],
)
def test_internal_addresses_are_forbidden(address):
    assert forbidden(address) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address):
    assert forbidden(address) is None
    assert ipaddress.ip_address(address).is_global


# --- the claim's copy (copy_material): before any nonce exists, every file hashed against the manifest -------


def copy_of(source, dest, manifest_hash, **kw):
    from replay.protocol.fetch import copy_material

    args = {"max_bytes": 64 << 20, "max_files": 100, "deadline_s": 30.0, "allowed_hosts": LOOPBACK, **kw}
    return copy_material(str(source), dest, manifest_hash, **args)


def test_the_claims_copy_of_a_share_or_a_url_verifies(served, transcripts, tmp_path):
    from replay.protocol.transcript_layout import sha256

    honest = transcripts["mlp", "det64"]
    want = sha256((honest / "manifest.json").read_bytes())
    for source, dest in ((honest, tmp_path / "local"), (served.url, tmp_path / "url")):
        counts = copy_of(source, dest, want)
        assert counts["files"] == 1 + len(named_files(manifest(honest)))
        assert verify(dest, honest / "claims.json", Budget(segments=100)).verdict == "verified"


def test_the_claims_copy_command_never_loads_torch(transcripts, tmp_path):
    """The worker runs one copy a claim (``python -m replay.protocol.fetch``): it hashes files, and loading torch
    would cost it seconds and a GiB of address space for nothing."""
    import os
    import subprocess
    import sys

    from replay.protocol.transcript_layout import sha256

    honest = transcripts["mlp", "det64"]
    want = sha256((honest / "manifest.json").read_bytes())
    code = (
        "import runpy, sys\n"
        "try:\n"
        "    runpy.run_module('replay.protocol.fetch', run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    argv = [str(honest), str(tmp_path / "copy"), "--manifest", want]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=root, env=env, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["copied"]["files"] == 1 + len(named_files(manifest(honest)))


def test_the_copy_refuses_what_is_not_as_committed_and_retries_what_failed_to_read(transcripts, tmp_path):
    from replay.protocol.fetch import BeyondCaps, NotAsCommitted, Unavailable
    from replay.protocol.transcript_layout import sha256

    from ..helpers import copy

    share = copy(transcripts["mlp", "det64"], tmp_path / "share")
    want = sha256((share / "manifest.json").read_bytes())
    with pytest.raises(NotAsCommitted) as other:
        copy_of(share, tmp_path / "a", "ab" * 32)
    assert other.value.verdict == "rejected" and "manifest.json does not match" in str(other.value)
    segment = share / "segments" / "00000004.safetensors"
    data = segment.read_bytes()
    segment.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(NotAsCommitted, match=r"segments/00000004\.safetensors does not match"):
        copy_of(share, tmp_path / "b", want)
    segment.unlink()  # the share withholds its fabricated segment: a failed read, retried by the worker
    with pytest.raises(Unavailable, match=r"segments/00000004\.safetensors: missing"):
        copy_of(share, tmp_path / "c", want)
    segment.symlink_to("/etc/hostname")  # a link out of the share: refused for good, never read
    with pytest.raises(NotAsCommitted) as link:
        copy_of(share, tmp_path / "d", want)
    assert link.value.verdict == "malformed" and "symbolic link" in str(link.value)
    segment.unlink()
    segment.write_bytes(data)
    with pytest.raises(BeyondCaps, match=r"bytes, more than the .* left to copy"):  # this copy's cap: ours
        copy_of(share, tmp_path / "e", want, max_bytes=len(data))


def test_a_file_over_the_copys_cap_is_refused_by_its_size_before_a_byte_is_copied(transcripts, tmp_path):
    """A 50 GB sparse checkpoint had been copied up to the cap (8 GiB by default, per claim, per try) and only then
    refused; over the cap is the copy's own limit, for a worker with larger caps, not the prover's fault."""
    from replay.protocol.fetch import BeyondCaps
    from replay.protocol.transcript_layout import sha256

    from ..helpers import copy

    share = copy(transcripts["mlp", "det64"], tmp_path / "share")
    want = sha256((share / "manifest.json").read_bytes())
    os.truncate(share / "checkpoints" / "00000000.safetensors", 50 << 30)
    started = time.monotonic()
    with pytest.raises(BeyondCaps, match=r"checkpoints/00000000\.safetensors: 53687091200 bytes, more than the"):
        copy_of(share, tmp_path / "copy", want, max_bytes=64 << 20)
    assert time.monotonic() - started < 10
    assert not (tmp_path / "copy" / "checkpoints" / "00000000.safetensors").exists()


def test_over_a_verifiers_fetch_caps_is_its_error_not_the_provers_fault(served, transcripts, monkeypatch, capsys):
    """An honest transcript over this verifier's bytes or files was "malformed": final, the prover blamed for the
    verifier's size."""
    claims = str(transcripts["mlp", "det64"] / "claims.json")
    argv = ["verify", served.url, "--claims", claims, "--allow-host", "127.0.0.1", "--json"]
    for name, value in (("REPLAY_FETCH_MAX_FILES", "3"), ("REPLAY_FETCH_MAX_BYTES", "100000")):
        monkeypatch.setenv(name, value)
        assert main(argv) == 3
        out = json.loads(capsys.readouterr().out)
        assert out["verdict"] == "error" and out["reasons"][0].startswith("transcript not fetched: "), out
        assert "more than the" in out["reasons"][0]
        monkeypatch.delenv(name)


def test_a_resolved_share_is_reached_without_a_link_anywhere_along_it(transcripts, tmp_path):
    """The worker checks a local location inside TRANSCRIPT_ROOTS, then the copy opens it: a prover who swapped its
    folder (or one above it) for a link in between had the copy follow it out of the roots."""
    from replay.protocol.fetch import NotAsCommitted, Unavailable
    from replay.protocol.transcript_layout import sha256

    from ..helpers import copy

    elsewhere = copy(transcripts["mlp", "det64"], tmp_path / "outside" / "run")
    want = sha256((elsewhere / "manifest.json").read_bytes())
    (tmp_path / "roots").mkdir()
    (tmp_path / "roots" / "prover").symlink_to(tmp_path / "outside")  # swapped in after the check
    swapped = tmp_path / "roots" / "prover" / "run"
    with pytest.raises(NotAsCommitted) as refused:
        copy_of(swapped, tmp_path / "a", want, no_links=True)
    assert refused.value.verdict == "malformed" and "reached through a symbolic link" in str(refused.value)
    assert not (tmp_path / "a" / "manifest.json").exists()
    with pytest.raises(Unavailable, match="the transcript directory: missing"):  # gone: a share's hiccup
        copy_of(tmp_path.resolve() / "roots" / "gone" / "run", tmp_path / "b", want, no_links=True)
    assert copy_of(elsewhere.resolve(), tmp_path / "c", want, no_links=True)["files"] > 1  # no link: copied
    assert copy_of(swapped, tmp_path / "d", want)["files"] > 1  # the CLI's own path may run through links


@pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="walks with O_PATH where the platform has it")
def test_a_folder_that_can_be_searched_but_not_read_is_walked_as_any_path_lookup_is(tmp_path, monkeypatch):
    """A prover's home folder of mode 0711: a path lookup needs search permission only. The walk had opened each
    folder for reading, so such a share was "reached through a symbolic link or a file": malformed, final. (Root
    reads any folder: the folder's refusal to be read is played by os.open where the test runs as root.)"""
    from replay.protocol import safeio

    share = tmp_path / "home" / "run"
    share.mkdir(parents=True)
    (share / "manifest.json").write_text("{}")
    (tmp_path / "home").chmod(0o311)  # search, no read
    real = os.open

    def as_for_another_user(path, flags, *args, **kwargs):
        if path == "home" and not flags & os.O_PATH:
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *args, **kwargs)

    if os.geteuid() == 0:
        monkeypatch.setattr(safeio.os, "open", as_for_another_user)
    try:
        fd = safeio.open_directory_no_links(share)
        assert os.read(safeio.open_inside(fd, "manifest.json"), 10) == b"{}"
        os.close(fd)
    finally:
        (tmp_path / "home").chmod(0o755)


def test_the_claims_copy_takes_the_workers_caps_as_large_as_it_sets_them(transcripts, tmp_path, monkeypatch):
    """The copy's command had bounded the worker's caps by its own 8 GiB and 100,000 files, so no worker, however
    large, could copy a transcript over them (the larger worker the caps' error sends it to included)."""
    from replay.protocol import fetch

    seen = {}
    monkeypatch.setattr(fetch, "copy_material", lambda *a, **kw: seen.update(kw) or {"files": 1, "bytes": 0})
    monkeypatch.setenv("REPLAY_FETCH_MAX_BYTES", str(64 << 30))
    monkeypatch.setenv("REPLAY_FETCH_MAX_FILES", "400001")
    assert fetch.main([str(tmp_path), str(tmp_path / "copy"), "--manifest", "ab" * 32]) == 0
    assert seen["max_bytes"] == 64 << 30 and seen["max_files"] == 400_001
    assert fetch.tightened_caps(seen["max_bytes"], seen["max_files"], 10.0)[:2] == (64 << 30, 400_001)


def test_a_manifest_padded_past_its_steps_or_a_file_that_grows_is_the_provers_not_over_our_caps(
    transcripts, tmp_path, monkeypatch
):
    """Over the copy's caps is the worker's error, retried for a larger one; a prover must not reach that by padding
    its manifest with files its steps do not imply, or by growing a file while it is copied."""
    from replay.protocol import fetch_transport
    from replay.protocol.fetch import NotAsCommitted, Unavailable
    from replay.protocol.transcript_layout import canonical_json, sha256

    from ..helpers import copy

    share = copy(transcripts["mlp", "det64"], tmp_path / "share")
    m = json.loads((share / "manifest.json").read_text())
    padded = {**m, "segments": {**m["segments"], **{str(10**6 + i): "ab" * 32 for i in range(3)}}}
    (share / "manifest.json").write_bytes(canonical_json(padded))
    with pytest.raises(NotAsCommitted) as refused:
        copy_of(share, tmp_path / "a", sha256(canonical_json(padded)), max_files=5)
    assert refused.value.verdict == "malformed" and "where its steps and checkpoint interval imply" in str(
        refused.value
    )
    (share / "manifest.json").write_bytes(canonical_json(m))
    real = os.fstat
    small = lambda fd: os.stat_result((*real(fd)[:6], 100, *real(fd)[7:]))  # as if it were 100 bytes when opened
    monkeypatch.setattr(fetch_transport.os, "fstat", small)
    with pytest.raises(Unavailable, match="it grew while it was copied"):
        copy_of(share, tmp_path / "b", sha256(canonical_json(m)))


def test_the_copys_bound_on_steps_is_the_schemas():
    """fetch keeps its own copy of MAX_STEPS (it stays torch-free): a schema that allowed more would have an honest
    manifest's files counted as padding."""
    from replay.protocol import fetch, manifest_schema

    assert fetch.MAX_STEPS == manifest_schema.MAX_STEPS


def test_a_searchable_folder_inside_the_share_a_socket_a_shrinking_file_and_a_respelled_step(
    transcripts, tmp_path, monkeypatch
):
    """From a probe of the copy: checkpoints/ of mode 0711 had been "not readable" (retried, then unavailable, for
    an honest share); a socket for a checkpoint "not readable" (retried, where a FIFO is refused); a file that
    shrank under the copy a final hash mismatch (where one that grows is retried); and a checkpoint keyed "00"
    beside the count its steps imply had copied file 0 twice and another never."""
    import socket as sockets

    from replay.protocol import safeio
    from replay.protocol.fetch import NotAsCommitted, Unavailable
    from replay.protocol.transcript_layout import canonical_json, sha256

    from ..helpers import copy

    share = copy(transcripts["mlp", "det64"], tmp_path / "share")
    m = json.loads((share / "manifest.json").read_text())
    want = sha256(canonical_json(m))
    real = os.open
    unreadable = lambda path, flags, *a, **kw: (
        (_ for _ in ()).throw(PermissionError(13, "denied"))
        if path == "checkpoints" and not flags & getattr(os, "O_PATH", 0)
        else real(path, flags, *a, **kw)
    )
    with monkeypatch.context() as patched:  # (root reads any folder: its refusal played by os.open)
        patched.setattr(safeio.os, "open", unreadable)
        assert copy_of(share, tmp_path / "a", want, no_links=True)["files"] > 1
    checkpoint = share / "checkpoints" / "00000004.safetensors"
    data = checkpoint.read_bytes()
    checkpoint.unlink()
    listener = sockets.socket(sockets.AF_UNIX)
    listener.bind(str(checkpoint))
    try:
        with pytest.raises(NotAsCommitted) as refused:
            copy_of(share, tmp_path / "b", want)
        assert refused.value.verdict == "malformed" and "not a regular file" in str(refused.value)
    finally:
        listener.close()
        checkpoint.unlink()
    checkpoint.write_bytes(data)
    real_fstat = os.fstat
    larger = lambda fd: os.stat_result((*real_fstat(fd)[:6], real_fstat(fd)[6] + 100, *real_fstat(fd)[7:]))
    with monkeypatch.context() as patched:
        patched.setattr(fetch_transport_module().os, "fstat", larger)  # as if it shrank after it was opened
        with pytest.raises(Unavailable, match="it shrank while it was copied"):
            copy_of(share, tmp_path / "c", want)
    respelled = {**m, "checkpoints": {("00" if k == "4" else k): v for k, v in m["checkpoints"].items()}}
    (share / "manifest.json").write_bytes(canonical_json(respelled))
    with pytest.raises(NotAsCommitted, match="does not name its checkpoints and segments"):
        copy_of(share, tmp_path / "d", sha256(canonical_json(respelled)))


def fetch_transport_module():
    from replay.protocol import fetch_transport

    return fetch_transport


@pytest.mark.parametrize("name,value", [("REPLAY_FETCH_SECONDS", "nan"), ("REPLAY_FETCH_SECONDS", "inf"),
                                        ("REPLAY_FETCH_MAX_BYTES", "-1"), ("REPLAY_FETCH_MAX_FILES", "0")])  # fmt: skip
def test_a_fetch_cap_that_is_not_a_positive_number_is_refused(name, value, monkeypatch):
    """REPLAY_FETCH_SECONDS=nan had turned the deadline off (a NaN deadline never passes); -1 bytes made every
    transcript over the cap."""
    from replay.protocol.fetch_limits import caps_or, tightened_caps

    monkeypatch.setenv(name, value)
    with pytest.raises(FetchRefused, match="not a positive number"):
        caps_or(8 << 30, 1000, 600.0)
    if float(value) <= 0:  # (tightening by NaN or infinity leaves the caller's cap: min keeps it)
        with pytest.raises(FetchRefused, match="not a positive number"):
            tightened_caps(8 << 30, 1000, 600.0)
    else:
        assert tightened_caps(8 << 30, 1000, 600.0) == (8 << 30, 1000, 600.0)
