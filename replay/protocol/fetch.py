"""Fetch a prover's transcript over http(s), inside the verifier's limited process, without trusting it.

    fetch_transcript(url, dest, max_bytes=..., max_files=..., deadline_s=..., allowed_hosts=frozenset())

1. ``manifest.json`` first (bounded by the manifest cap and ``max_bytes``); it is validated with the
   transcript reader's own manifest parser before anything else is requested.
2. Then only the files that validated manifest names (checkpoints and segments, at names built
   here from integer steps, never from the prover's strings); more than ``max_files`` in all is
   refused before the second request.
3. Every connection goes to an address checked here: the host is resolved once, every address it
   resolves to must be globally routable (no loopback, private, link-local / cloud metadata,
   multicast, reserved, shared or unspecified address, also not inside IPv4-mapped, 6to4, Teredo or
   NAT64 IPv6), and the socket connects to that checked address itself, so a DNS answer cannot
   change between check and connect. Hosts in ``allowed_hosts`` (tests, on-premises stores) skip
   the address check. Redirects are followed (at most ``MAX_REDIRECTS``) through the same check.
4. Total bytes, file count and one wall-clock deadline bound the whole fetch; the environment
   (``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``, ``REPLAY_FETCH_SECONDS``) can only
   tighten the caps the caller passes, so the worker bounds whatever the CLI asks for.

Failures raise ``FetchRefused(reason)``: the reason says what failed (which file, which limit, which
kind of address) and never carries what a server answered (no body, no headers).

Standard library only; the manifest parser (which needs torch) is imported when first used.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import ssl
import time
import urllib.parse
from pathlib import Path

MAX_REDIRECTS = 3
CHUNK = 1 << 20
SAFE = "/%:@!$&'()*+,;=-._~"
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class FetchRefused(Exception):
    """The transcript could not be fetched; the message is safe to show the prover."""

    def __init__(self, reason: str, transient: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient  # a failure that may not recur (a read, a transfer, a deadline), not a refusal


class _Budget:
    """What is left of the fetch's bytes, files and time."""

    def __init__(self, max_bytes: int, max_files: int, deadline_s: float):
        self.bytes, self.files, self.max_files, self.seconds = max_bytes, max_files, max_files, deadline_s
        self.deadline = time.monotonic() + deadline_s

    def take_file(self, name: str) -> None:
        if self.files <= 0:
            raise FetchRefused(f"{name}: more than the {self.max_files} files allowed")
        self.files -= 1

    def left(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise FetchRefused(f"fetching the transcript took longer than {self.seconds:g} s", transient=True)
        return remaining


def fetch_transcript(
    url: str,
    dest: Path,
    *,
    max_bytes: int,
    max_files: int,
    deadline_s: float,
    allowed_hosts: frozenset[str] = frozenset(),
) -> Path:
    """Copy the transcript at ``url`` into ``dest`` (created) and return ``dest``; see the module docstring."""
    from replay.protocol.transcript import MAX_MANIFEST_BYTES, MalformedTranscript, Transcript

    max_bytes, max_files, deadline_s = _tightened(max_bytes, max_files, deadline_s)
    base = _base(url)
    allowed = frozenset(h.lower().strip("[]") for h in allowed_hosts)
    budget = _Budget(max_bytes, max_files, deadline_s)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    _get(base, "manifest.json", dest, budget, allowed, MAX_MANIFEST_BYTES)
    try:
        manifest = Transcript(dest).manifest
    except MalformedTranscript as malformed:
        raise FetchRefused(f"manifest.json: {malformed.reason}") from None
    names = named_files(manifest)
    if 1 + len(names) > max_files:
        raise FetchRefused(f"the manifest names {1 + len(names)} files, more than the {max_files} allowed")
    for name in names:
        _get(base, name, dest, budget, allowed)
    return dest


def _tightened(max_bytes: int, max_files: int, deadline_s: float) -> tuple[int, int, float]:
    """The caps, tightened by the environment of the process (the worker sets them for the verifier it starts,
    whatever the command line passes): ``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``, ``REPLAY_FETCH_SECONDS``."""
    try:
        max_bytes = min(max_bytes, int(os.environ.get("REPLAY_FETCH_MAX_BYTES", max_bytes)))
        max_files = min(max_files, int(os.environ.get("REPLAY_FETCH_MAX_FILES", max_files)))
        deadline_s = min(deadline_s, float(os.environ.get("REPLAY_FETCH_SECONDS", deadline_s)))
    except ValueError:
        raise FetchRefused("a REPLAY_FETCH_* limit in the environment is not a number") from None
    return max_bytes, max_files, deadline_s


def named_files(manifest: dict) -> list[str]:
    """Relative paths of the files a validated manifest commits to, built from its integer steps."""
    names = [f"checkpoints/{int(step):08d}.safetensors" for step in manifest["checkpoints"]]
    return names + [f"segments/{int(start):08d}.safetensors" for start in manifest["segments"]]


def _base(url: str) -> urllib.parse.SplitResult:
    if not isinstance(url, str) or len(url) > 2048 or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise FetchRefused("the transcript URL must be a printable http(s) URL of at most 2048 characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        raise FetchRefused("the transcript URL cannot be parsed") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchRefused("the transcript URL must be http:// or https:// with a host name")
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return parts._replace(path=path, query="", fragment="")


def _get(
    base: urllib.parse.SplitResult,
    name: str,
    dest: Path,
    budget: _Budget,
    allowed: frozenset[str],
    cap: int | None = None,
) -> None:
    """One file of the transcript into ``dest / name``, following redirects through the address check."""
    budget.take_file(name)
    url = urllib.parse.urlunsplit(base._replace(path=urllib.parse.urljoin(base.path, name)))
    for _hop in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        connection = _connect(parts, name, budget, allowed)
        try:
            target = urllib.parse.quote(parts.path or "/", safe=SAFE)
            if parts.query:
                target += "?" + urllib.parse.quote(parts.query, safe=SAFE + "?")
            connection.request("GET", target, headers=_HEADERS)
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                url = _redirect(url, response.getheader("Location"), name)
                continue
            if response.status != 200:
                raise FetchRefused(
                    f"{name}: the transcript server answered HTTP status {response.status}", transient=True
                )
            _save(response, dest / name, name, budget, cap)
            return
        except (OSError, http.client.HTTPException) as error:
            budget.left()  # a read cut short by the deadline is the deadline's failure
            raise FetchRefused(
                f"{name}: the transfer from {parts.hostname} failed ({type(error).__name__})", transient=True
            ) from None
        finally:
            connection.close()
    raise FetchRefused(f"{name}: more than {MAX_REDIRECTS} redirects")


_HEADERS = {"User-Agent": "chipledger-replay-fetch/1", "Accept-Encoding": "identity"}


def _redirect(url: str, location: str | None, name: str) -> str:
    if not location:
        raise FetchRefused(f"{name}: a redirect without a Location")
    target = urllib.parse.urljoin(url, location)
    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
        raise FetchRefused(f"{name}: a redirect to a scheme other than http(s)")
    return target


def _save(response, path: Path, name: str, budget: _Budget, cap: int | None) -> None:
    limit = budget.bytes if cap is None else min(cap, budget.bytes)
    declared = response.getheader("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise FetchRefused(f"{name}: {int(declared)} bytes, more than the {limit} left to fetch")
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with open(path, "wb") as out:
        while True:
            budget.left()
            chunk = response.read(min(CHUNK, limit + 1 - size))
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise FetchRefused(f"{name}: more than the {limit} bytes left to fetch")
            out.write(chunk)
    budget.bytes -= size


# --------------------------------------------------------------------------- addresses


def _connect(parts: urllib.parse.SplitResult, name: str, budget: _Budget, allowed: frozenset[str]):
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = _checked_address(host, port, name, allowed)
    timeout = min(budget.left(), 30.0)
    if parts.scheme == "https":
        return _PinnedTLS(host, port, address, timeout)
    return _Pinned(host, port, address, timeout)


def _checked_address(host: str, port: int, name: str, allowed: frozenset[str]) -> str:
    """The first address ``host`` resolves to, once every address it resolves to passed the check."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise FetchRefused(f"{name}: the host {host} does not resolve", transient=True) from None
    addresses = [info[4][0] for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    if not addresses:
        raise FetchRefused(f"{name}: the host {host} has no IPv4 or IPv6 address")
    if host not in allowed:
        for address in addresses:
            why = forbidden(address)
            if why:
                raise FetchRefused(f"{name}: the host {host} resolves to a {why} address, which is never fetched")
    return addresses[0]


def forbidden(address: str) -> str | None:
    """Why an address must not be connected to (e.g. "loopback"), or None for a globally routable one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    embedded = []
    if ip.version == 6:
        embedded = [ip.ipv4_mapped, ip.sixtofour, ip.teredo and ip.teredo[1]]
        if ip in NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    for candidate in [*(e for e in embedded if e is not None), ip]:
        for kind in ("loopback", "link_local", "private", "multicast", "reserved", "unspecified"):
            if getattr(candidate, f"is_{kind}"):
                return kind.replace("_", "-")
        if not candidate.is_global:
            return "non-global"
    return None


class _Pinned(http.client.HTTPConnection):
    """HTTP to an address checked beforehand; the Host header still names the host."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedTLS(_Pinned):
    """HTTPS to a checked address, the certificate verified against the host name."""

    default_port = 443

    def connect(self) -> None:
        super().connect()
        self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.host)


# --------------------------------------------------------------------------- the claim's own copy


class Unavailable(Exception):
    """The prover's material could not be read (a transfer or read failed, a file missing, the deadline): the
    prover's failure, retried a bounded number of times. The message names the file and what failed, never
    what a server or file held."""


class NotAsCommitted(Exception):
    """The material is refused for good: ``verdict`` "malformed" (a forbidden address, a link, over a cap, a
    manifest naming no files) or "rejected" (a file that does not match the manifest's commitment)."""

    def __init__(self, reason: str, verdict: str):
        super().__init__(reason)
        self.verdict = verdict


def copy_material(
    source: str,
    dest: Path,
    manifest_hash: str,
    *,
    max_bytes: int,
    max_files: int,
    deadline_s: float,
    allowed_hosts: frozenset[str] = frozenset(),
) -> dict:
    """Copy the manifest and every file it commits to from ``source`` (an http(s) URL or a local directory)
    into ``dest``, each size-capped and hashed against the commitment, BEFORE any verifier nonce exists:
    the prover's share then cannot learn which segments a draw picked and fail just those reads.

    Raises ``Unavailable`` (a read of the prover's failed: retried), ``NotAsCommitted`` (refused for good) or
    ``OSError`` writing ``dest`` (ours). Returns counts."""
    import hashlib
    import json

    from replay.protocol.transcript import MAX_MANIFEST_BYTES

    max_bytes, max_files, deadline_s = _tightened(max_bytes, max_files, deadline_s)
    budget = _Budget(max_bytes, max_files, deadline_s)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = source.startswith(("http://", "https://"))
    base = _base(source) if remote else None
    allowed = frozenset(h.lower().strip("[]") for h in allowed_hosts)

    def one(name: str, want: str, cap: int | None = None) -> None:
        try:
            if remote:
                _get(base, name, dest, budget, allowed, cap)
            else:
                _copy_local(Path(source), name, dest, budget, cap)
        except FetchRefused as refused:
            if refused.transient:
                raise Unavailable(refused.reason) from None
            raise NotAsCommitted(refused.reason, "malformed") from None
        digest = hashlib.sha256()
        with open(dest / name, "rb") as copied:
            for chunk in iter(lambda: copied.read(CHUNK), b""):
                digest.update(chunk)
        if digest.hexdigest() != want:
            raise NotAsCommitted(f"{name} does not match the manifest's commitment", "rejected")

    one("manifest.json", manifest_hash, MAX_MANIFEST_BYTES)
    try:
        manifest = json.loads((dest / "manifest.json").read_bytes())
        names = committed_files(manifest)
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        raise NotAsCommitted("manifest.json does not name its checkpoints and segments", "malformed") from None
    if 1 + len(names) > max_files:
        raise NotAsCommitted(
            f"the manifest names {1 + len(names)} files, more than the {max_files} allowed", "malformed"
        )
    for name, want in names:
        one(name, want)
    return {"files": 1 + len(names), "bytes": max_bytes - budget.bytes}


def committed_files(manifest: dict) -> list[tuple[str, str]]:
    """[(relative path, SHA-256)] of the checkpoint and segment files a manifest commits to: names built from
    integer steps, never from the prover's strings (the full schema is the verifier's to check)."""
    out = []
    for folder in ("checkpoints", "segments"):
        for step, digest in manifest[folder].items():
            if not (step.isdigit() and len(step) <= 12) or not (
                isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")
            ):
                raise ValueError(folder)
            out.append((f"{folder}/{int(step):08d}.safetensors", digest))
    return out


def _copy_local(root: Path, name: str, dest: Path, budget: _Budget, cap: int | None) -> None:
    """One file of a local share, opened without following links (safeio), into ``dest / name``."""
    from replay.protocol.safeio import Refused, open_inside

    budget.take_file(name)
    limit = budget.bytes if cap is None else min(cap, budget.bytes)
    try:
        fd = open_inside(root, name)
    except (
        Refused
    ) as refused:  # a link or a device is a refusal; a missing or unreadable file may be the share's hiccup
        text = str(refused)
        raise FetchRefused(text, transient=text.endswith(": missing") or ": not readable" in text) from None
    path = dest / name
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with os.fdopen(fd, "rb") as src, open(path, "wb") as out:
        while True:
            budget.left()
            try:
                chunk = src.read(min(CHUNK, limit + 1 - size))
            except OSError as error:
                raise FetchRefused(f"{name}: the read failed ({type(error).__name__})", transient=True) from None
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise FetchRefused(f"{name}: more than the {limit} bytes left to copy")
            out.write(chunk)
    budget.bytes -= size


def main(argv: list[str] | None = None) -> int:
    """``python -m replay.protocol.fetch SOURCE DEST --manifest HASH [--allow-host H ...]``: the claim's copy, run by the
    worker in a limited subprocess. Prints one JSON object; exit 0 copied, 5 unavailable (a read failed: retried),
    2 refused for good ({"verdict": "malformed" | "rejected", "reasons"}), 3 ours."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m replay.protocol.fetch")
    p.add_argument("source")
    p.add_argument("dest", type=Path)
    p.add_argument("--manifest", required=True)
    p.add_argument("--allow-host", action="append", default=[])
    args = p.parse_args(argv)
    try:
        counts = copy_material(
            args.source,
            args.dest,
            args.manifest,
            max_bytes=8 << 30,
            max_files=100_000,
            deadline_s=3600.0,
            allowed_hosts=frozenset(args.allow_host),
        )
    except Unavailable as e:
        print(json.dumps({"unavailable": str(e)[:500]}))
        return 5
    except NotAsCommitted as e:
        print(json.dumps({"verdict": e.verdict, "reasons": [str(e)[:500]]}))
        return 2
    except OSError as e:  # writing our own copy failed (disk full...): ours, retried
        print(json.dumps({"error": f"writing the copy failed ({type(e).__name__})"}))
        return 3
    print(json.dumps({"copied": counts}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
