"""Fetch a prover's transcript, inside a limited process, without trusting it: ``fetch_transcript`` (a URL given to
``python -m replay verify``) and ``copy_material`` (the claim's own copy, ``python -m replay.protocol.fetch``).

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
   the address check (pinned_http.py). Redirects are followed (at most ``MAX_REDIRECTS``) through the same
   check (fetch_transport.py).
4. Total bytes, file count and one wall-clock deadline bound the whole fetch; the environment
   (``REPLAY_FETCH_MAX_BYTES``, ``REPLAY_FETCH_MAX_FILES``, ``REPLAY_FETCH_SECONDS``) can only
   tighten the caps the caller passes, so the worker bounds whatever the CLI asks for (fetch_limits.py).

Failures raise ``FetchRefused(reason)``: the reason says what failed (which file, which limit, which
kind of address) and never carries what a server answered (no body, no headers).

Standard library only; the manifest parser (which needs torch) is imported when first used.
"""

from __future__ import annotations

import os
from pathlib import Path

from replay.protocol.fetch_limits import MAX_MANIFEST_BYTES, FetchBudget, FetchRefused, caps_or, tightened_caps
from replay.protocol.fetch_transport import CHUNK, copy_local_file, get_file, transcript_base_url
from replay.protocol.safeio import Refused, open_directory_no_links


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
    from replay.protocol.transcript import MalformedTranscript, Transcript

    max_bytes, max_files, deadline_s = tightened_caps(max_bytes, max_files, deadline_s)
    base = transcript_base_url(url)
    allowed = frozenset(h.lower().strip("[]") for h in allowed_hosts)
    budget = FetchBudget(max_bytes, max_files, deadline_s)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    get_file(base, "manifest.json", dest, budget, allowed, MAX_MANIFEST_BYTES)
    try:
        manifest = Transcript(dest).manifest
    except MalformedTranscript as malformed:
        raise FetchRefused(f"manifest.json: {malformed.reason}") from None
    names = named_files(manifest)
    if 1 + len(names) > max_files:
        raise FetchRefused(f"the manifest names {1 + len(names)} files, more than the {max_files} allowed", ours=True)
    for name in names:
        get_file(base, name, dest, budget, allowed)
    return dest


def named_files(manifest: dict) -> list[str]:
    """Relative paths of the files a validated manifest commits to, built from its integer steps."""
    names = [f"checkpoints/{int(step):08d}.safetensors" for step in manifest["checkpoints"]]
    return names + [f"segments/{int(start):08d}.safetensors" for start in manifest["segments"]]


class Unavailable(Exception):
    """The prover's material could not be read (a transfer or read failed, a file missing, the deadline): the
    prover's failure, retried a bounded number of times. The message names the file and what failed, never
    what a server or file held."""


class BeyondCaps(Exception):
    """The material is over this copy's own byte or file cap: the verifier's limit, not the prover's fault (an
    honest transcript of a large model is tens of GB); a worker with larger caps may copy it."""


# `main`'s exits besides 0 (copied) and 2 (refused for good), which the worker reads (inspections/verification.py)
EXIT_OURS, EXIT_UNAVAILABLE, EXIT_BEYOND_CAPS = 3, 5, 6


class NotAsCommitted(Exception):
    """The material is refused for good: ``verdict`` "malformed" (a forbidden address, a link, a manifest over the
    format's cap or not naming its files as its steps imply) or "rejected" (a file that does not match the
    manifest's commitment)."""

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
    no_links: bool = False,
) -> dict:
    """Copy the manifest and every file it commits to from ``source`` (an http(s) URL or a local directory)
    into ``dest``, each size-capped and hashed against the commitment, BEFORE any verifier nonce exists:
    the prover's share then cannot learn which segments a draw picked and fail just those reads. ``no_links``: a
    local source is a path the caller resolved and checked, reached with no link anywhere along it
    (`safeio.open_directory_no_links`), once, for every file.

    Raises ``Unavailable`` (a read of the prover's failed: retried), ``NotAsCommitted`` (refused for good),
    ``BeyondCaps`` (over this copy's own caps: ours) or ``OSError`` writing ``dest`` (ours). Returns counts."""
    max_bytes, max_files, deadline_s = tightened_caps(max_bytes, max_files, deadline_s)
    budget = FetchBudget(max_bytes, max_files, deadline_s)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    remote = source.startswith(("http://", "https://"))
    base = transcript_base_url(source) if remote else None
    allowed = frozenset(h.lower().strip("[]") for h in allowed_hosts)
    root = _local_root(source, no_links) if not remote else None
    try:
        return _copy_each(root, base, dest, manifest_hash, budget, allowed, max_bytes, max_files)
    finally:
        if isinstance(root, int):
            os.close(root)


def _local_root(source: str, no_links: bool) -> Path | int:
    """A local source as `copy_local_file` reads it: its path, or (no_links) a descriptor reached without links."""
    if not no_links:
        return Path(source)
    try:
        return open_directory_no_links(Path(source))
    except Refused as refused:
        if not refused.transient:  # a link or a file along it: the prover's doing
            raise NotAsCommitted(str(refused), "malformed") from None
        raise Unavailable(str(refused)) from None  # gone or unreadable: retried, as a file of the share is


def _copy_each(root, base, dest: Path, manifest_hash: str, budget, allowed, max_bytes: int, max_files: int) -> dict:
    """`copy_material`'s copies: the manifest, then each file it commits to (root a local share's, else base a URL's)."""
    import hashlib
    import json

    remote = root is None

    def one(name: str, want: str, cap: int | None = None) -> None:
        try:
            if remote:
                get_file(base, name, dest, budget, allowed, cap)
            else:
                copy_local_file(root, name, dest, budget, cap)
        except FetchRefused as refused:
            if refused.transient:
                raise Unavailable(refused.reason) from None
            if refused.ours:
                raise BeyondCaps(refused.reason) from None
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
    implied = _implied_files(manifest)
    if implied is not None and len(names) != implied:  # padded past a cap, it would read as ours
        raise NotAsCommitted(
            f"the manifest names {len(names)} checkpoints and segments, where its steps and checkpoint interval "
            f"imply {implied}",
            "malformed",
        )
    if 1 + len(names) > max_files:
        why = f"the manifest names {1 + len(names)} files, more than the {max_files} allowed"
        if implied is None:  # (a manifest without its steps is malformed whatever its size)
            raise NotAsCommitted(why, "malformed")
        raise BeyondCaps(why)
    for name, want in names:
        one(name, want)
    return {"files": 1 + len(names), "bytes": max_bytes - budget.bytes}


MAX_STEPS = 200_000  # manifest_schema.MAX_STEPS (this module stays torch-free)


def _implied_files(manifest: dict) -> int | None:
    """How many checkpoints and segments a manifest's steps and checkpoint interval imply (manifest_schema's rule: a
    checkpoint at every interval and at the end, a segment before each but the last), or None where it does not state
    them within the schema's bounds (the verifier's to refuse)."""
    steps, interval = manifest.get("steps"), manifest.get("checkpoint_interval")
    if type(steps) is not int or type(interval) is not int or not 1 <= interval <= steps <= MAX_STEPS:
        return None
    checkpoints = -(-steps // interval) + 1  # 0, interval, ... below steps, and steps itself
    return 2 * checkpoints - 1


def committed_files(manifest: dict) -> list[tuple[str, str]]:
    """[(relative path, SHA-256)] of the checkpoint and segment files a manifest commits to: names built from
    integer steps, never from the prover's strings (the full schema is the verifier's to check)."""
    out = []
    for folder in ("checkpoints", "segments"):
        for step, digest in manifest[folder].items():
            # canonical decimals only: "00" and "0" would name one file twice and another never
            if not (step.isascii() and step.isdigit() and len(step) <= 12 and str(int(step)) == step) or not (
                isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")
            ):
                raise ValueError(folder)
            out.append((f"{folder}/{int(step):08d}.safetensors", digest))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m replay.protocol.fetch SOURCE DEST --manifest HASH [--allow-host H ...]``: the claim's copy, run by the
    worker in a limited subprocess. Prints one JSON object; exit 0 copied, 5 unavailable (a read failed: retried),
    2 refused for good ({"verdict": "malformed" | "rejected", "reasons"}), 3 ours, 6 over the copy's own caps
    ({"beyond_caps": why}: ours too, for a worker with larger caps)."""
    import argparse
    import json
    import sys

    p = argparse.ArgumentParser(prog="python -m replay.protocol.fetch")
    p.add_argument("source")
    p.add_argument("dest", type=Path)
    p.add_argument("--manifest", required=True)
    p.add_argument("--allow-host", action="append", default=[])
    p.add_argument("--no-links", action="store_true", help="SOURCE is a resolved path: refuse a link anywhere along it")
    args = p.parse_args(argv)
    try:
        # the worker's own caps (its environment), as large as it sets them: a worker with larger caps is the one a
        # transcript over another's is sent to (REPLAY_LARGE_QUEUE); these defaults only where none is set
        max_bytes, max_files, deadline_s = caps_or(8 << 30, 100_000, 3600.0)
        counts = copy_material(
            args.source,
            args.dest,
            args.manifest,
            max_bytes=max_bytes,
            max_files=max_files,
            deadline_s=deadline_s,
            allowed_hosts=frozenset(args.allow_host),
            no_links=args.no_links,
        )
    except FetchRefused as e:  # (caps_or: a REPLAY_FETCH_* that is not a number: ours)
        print(json.dumps({"error": str(e)[:500]}))
        return EXIT_OURS
    except Unavailable as e:
        print(json.dumps({"unavailable": str(e)[:500]}))
        return EXIT_UNAVAILABLE
    except NotAsCommitted as e:
        print(json.dumps({"verdict": e.verdict, "reasons": [str(e)[:500]]}))
        return 2
    except BeyondCaps as e:
        print(json.dumps({"beyond_caps": str(e)[:500]}))
        return EXIT_BEYOND_CAPS
    except OSError as e:  # writing our own copy failed (disk full...): ours, retried
        print(json.dumps({"error": f"writing the copy failed ({type(e).__name__})"}))
        return EXIT_OURS
    print(json.dumps({"copied": counts}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
