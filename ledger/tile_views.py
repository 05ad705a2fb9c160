"""The ledger as C2SP tlog-tiles under ``/tlog/`` (docs/ledger.md, Tiles). Thin: parse, read, render.

Plain Django views, not DRF: a tile read is the hot path of every mirror and monitor.
"""

from __future__ import annotations

import gzip
import hashlib

from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse, HttpResponseNotModified
from django.utils.cache import patch_vary_headers
from django.utils.http import parse_etags
from django.views.decorators.http import require_safe

from tlog import tiles as tile_paths

from . import selectors, tile_reads

IMMUTABLE = "public, max-age=31536000, immutable"
# A partial tile never changes either, but the log may drop it once the full tile exists (tlog-tiles).
SHORT_LIVED = "public, max-age=60"
CHECKPOINT_CACHE = "no-cache, max-age=0"
OCTETS = "application/octet-stream"
MAX_LEAVES = 2**53  # entry seqs are below 2^53 (I-JSON): no tile starts beyond
GZIP_LEVEL = 6
GZIP_CACHE_SECONDS = 24 * 3600  # a full bundle's compressed bytes never change: compressed once a day at most


def _not_found(reason: str) -> HttpResponse:
    response = HttpResponse(reason + "\n", status=404, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"  # the tile may exist a moment later
    return response


@require_safe
def checkpoint(request):
    latest = selectors.checkpoint_served(settings.LEDGER_WITNESS_QUORUM)
    if latest is None:
        return _not_found("the log is empty: no checkpoint yet")
    response = HttpResponse(selectors.checkpoint_text(latest), content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = CHECKPOINT_CACHE
    return response


@require_safe
def tile(request, path: str):
    try:
        level, index, width = tile_paths.parse_path("tile/" + path)
    except tile_paths.TilePathError as error:
        return _not_found(str(error))
    if index << (tile_paths.TILE_HEIGHT * ((level or 0) + 1)) >= MAX_LEAVES:  # starts past any log (and int64)
        return _not_found(f"no such tile in the tree yet: tile/{path}")
    data = tile_reads.entry_bundle(index, width) if level is None else tile_reads.tile(level, index, width)
    if data is None:
        return _not_found(f"no such tile in the tree yet: tile/{path}")
    # Entry bundles go gzip-compressed to a client that accepts it (the spec's SHOULD); hash tiles are random
    # bytes that do not compress. Each representation has its own strong ETag, and both say Vary.
    compressed = level is None and accepts_gzip(request.headers.get("Accept-Encoding", ""))
    if compressed:
        data = _gzipped_bundle(width, data)
    etag = '"' + hashlib.sha256(data).hexdigest() + '"'
    response = HttpResponseNotModified() if _matches(request, etag) else HttpResponse(data, content_type=OCTETS)
    if compressed and response.status_code == 200:
        response["Content-Encoding"] = "gzip"
    if level is None:
        patch_vary_headers(response, ("Accept-Encoding",))
    response["ETag"] = etag
    response["Cache-Control"] = IMMUTABLE if width is None else SHORT_LIVED
    return response


def _matches(request, etag: str) -> bool:
    """If-None-Match names this representation (weak comparison, as RFC 9110 asks for it)."""
    header = request.headers.get("If-None-Match", "")
    if header.strip() == "*":
        return True
    return etag in {tag.removeprefix("W/") for tag in parse_etags(header)}


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header accepts gzip: listed (or ``*``) with a q-value above 0."""
    qualities = {}
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        qualities[coding.lower()] = quality
    for coding in ("gzip", "x-gzip", "*"):
        if coding in qualities:
            return qualities[coding] > 0
    return False


def _gzipped_bundle(width: int | None, data: bytes) -> bytes:
    """Deterministic gzip (no name, mtime 0): the same bytes, hence the same ETag, on every request.

    A full bundle's compressed bytes are cached under the SHA-256 of its own bytes, never under its index:
    a cache that outlives a database can then never serve another log's bundle."""
    if width is not None:
        return gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
    key = "tlog:gzip:" + hashlib.sha256(data).hexdigest()
    body = cache.get(key)
    if body is None:
        body = gzip.compress(data, compresslevel=GZIP_LEVEL, mtime=0)
        cache.set(key, body, GZIP_CACHE_SECONDS)
    return body
