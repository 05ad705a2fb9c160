"""Fetching a prover's transcript for one verification, without trusting it.

A location is a directory under one of the configured roots (``TRANSCRIPT_ROOTS``:
a share the prover exports to the verifier) or an http(s) URL of the transcript
directory. URL fetches copy only the files the manifest names, each bounded in
size, into a temporary directory that is deleted after the verification; the
replay verifier then checks every byte against the manifest's hashes.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path

from django.conf import settings

MAX_FILE_BYTES = 512 * 2**20
MAX_MANIFEST_BYTES = 16 * 2**20
STEP_KEY = re.compile(r"[0-9]{1,12}")


class TranscriptUnavailable(Exception):
    """The location cannot be used: outside the allowed roots, unreachable, or too large."""


def local_directory(location: str) -> Path:
    path = Path(location).resolve()
    roots = [Path(root).resolve() for root in settings.TRANSCRIPT_ROOTS]
    if not any(path == root or root in path.parents for root in roots):
        raise TranscriptUnavailable(f"{location} is not under an allowed transcript root")
    if not (path / "manifest.json").is_file():
        raise TranscriptUnavailable(f"{location} has no manifest.json")
    return path


def download(url: str, into: Path) -> Path:
    """Copy manifest.json and the checkpoints and segments it names from ``url`` into ``into``."""
    base = url.rstrip("/") + "/"
    into.mkdir(parents=True, exist_ok=True)
    manifest = _get(base + "manifest.json", MAX_MANIFEST_BYTES)
    (into / "manifest.json").write_bytes(manifest)
    try:
        named = json.loads(manifest)
    except ValueError:
        return into  # the verifier reports the malformed manifest
    for folder in ("checkpoints", "segments"):
        (into / folder).mkdir(exist_ok=True)
        for step in (named.get(folder) or {}) if isinstance(named, dict) else {}:
            if not STEP_KEY.fullmatch(str(step)):
                continue  # never let a name from the prover pick a path
            name = f"{folder}/{int(step):08d}.safetensors"
            (into / name).write_bytes(_get(base + name, MAX_FILE_BYTES))
    return into


def _get(url: str, limit: int) -> bytes:
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise TranscriptUnavailable(f"{url}: only http(s) URLs are fetched")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read(limit + 1)
    except OSError as error:
        raise TranscriptUnavailable(f"{url}: {error}") from error
    if len(data) > limit:
        raise TranscriptUnavailable(f"{url}: larger than {limit} bytes")
    return data
