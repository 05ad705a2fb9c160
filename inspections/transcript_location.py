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
from pathlib import Path

from django.conf import settings

URL_SCHEMES = ("http://", "https://")
FOLDERS = ("checkpoints", "segments")
MAX_ENTRIES = 100_000


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
                        f"{folder}/{entry.name[:80]} is a symlink; transcripts hold plain files"
                    )
