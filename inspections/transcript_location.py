"""Where a prover's transcript is read from, without trusting the location.

A location is a directory under one of the configured roots (``TRANSCRIPT_ROOTS``: a share the
prover exports to the verifier) or an http(s) URL of the transcript directory. URLs are never
fetched here, in the worker: the verifier's limited subprocess fetches them itself
(``replay.protocol.fetch``), so a hostile server meets the same time and memory limits as a hostile
transcript. A local location must lie under a root after resolving every symlink, and no entry of
the transcript (its manifest, checkpoints, segments) may be a symlink: a link to a host file whose
hash the prover committed would otherwise turn the verifier's answer into an oracle on that file.
"""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

URL_SCHEMES = ("http://", "https://")
FOLDERS = ("checkpoints", "segments")
MAX_ENTRIES = 100_000


MAX_LOCATION = 1024


def location_problem(location) -> str | None:
    """Why a claim may not carry ``location``, or None. The location is published on the ledger for ever, so
    it carries no secret: no user:password@, and no query or fragment (a presigned URL's token would let
    anyone read the transcript, the model's weights among it); a prover keeps a transcript private behind
    a share under ``TRANSCRIPT_ROOTS`` or a server that admits the verifier by address."""
    if not isinstance(location, str) or not 0 < len(location) <= MAX_LOCATION:
        return f"location is an absolute path or an http(s) URL of at most {MAX_LOCATION} characters"
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in location):
        return "location must not contain control characters (newlines, tabs) or lone surrogates"
    if location.startswith("/"):
        return None
    if not is_url(location):
        scheme = location.split(":", 1)[0][:16] + ":" if ":" in location else "a relative path"
        return f"location is an absolute path or an http(s) URL, not {scheme}"
    parts = urlsplit(location)
    if "@" in parts.netloc:
        return "location must not carry credentials (user:password@): it is published on the ledger"
    if parts.query or parts.fragment or "?" in location or "#" in location:
        return (
            "location must not carry a query or fragment: it is published on the ledger, and a token in it "
            "would open the transcript to everyone"
        )
    if not parts.hostname:
        return "location is an http(s) URL with a host"
    return None


class TranscriptUnavailable(Exception):
    """The location cannot be used: outside the allowed roots, or not a plain transcript directory."""


def is_url(location: str) -> bool:
    return location.startswith(URL_SCHEMES)


def local_directory(location: str) -> Path:
    """The transcript directory at ``location``, checked to lie under an allowed root with no symlink in it."""
    if "\x00" in location:
        raise TranscriptUnavailable("the location contains a NUL character")
    given = Path(location)
    path = given.resolve()
    roots = [Path(root).resolve() for root in settings.TRANSCRIPT_ROOTS]
    if not given.is_absolute() or not any(path == root or root in path.parents for root in roots):
        raise TranscriptUnavailable(f"{location} is not under an allowed transcript root")
    _no_links(path)
    return path


def _no_links(path: Path) -> None:
    """The manifest and the checkpoint and segment folders hold only regular files (no symlinks)."""
    try:
        manifest = os.lstat(path / "manifest.json")
    except OSError:
        raise TranscriptUnavailable("the transcript has no manifest.json") from None
    if not stat.S_ISREG(manifest.st_mode):
        raise TranscriptUnavailable("manifest.json is not a regular file")
    for folder in FOLDERS:
        where = path / folder
        if not where.exists() and not where.is_symlink():
            continue
        if where.is_symlink() or not where.is_dir():
            raise TranscriptUnavailable(f"{folder} is not a plain directory")
        with os.scandir(where) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_ENTRIES:
                    raise TranscriptUnavailable(f"{folder} holds more than {MAX_ENTRIES} entries")
                if entry.is_symlink():
                    raise TranscriptUnavailable(
                        # (repr: a prover's file name may hold a newline, a terminal escape or non-UTF-8 bytes, and this
                        # reason goes on the public ledger)
                        f"{folder}/{entry.name[:80]!r} is a symlink; transcripts hold plain files"
                    )
