"""The ledger as C2SP tlog-tiles under ``/tlog/`` (docs/ledger.md, Tiles). Thin: parse, read, render.

Plain Django views, not DRF: a tile read is the hot path of every mirror and monitor.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.http import HttpResponse, HttpResponseNotModified
from django.views.decorators.http import require_safe

from tlog import tiles as tile_paths

from . import selectors, tile_reads

IMMUTABLE = "public, max-age=31536000, immutable"
# A partial tile never changes either, but the log may drop it once the full tile exists (tlog-tiles).
SHORT_LIVED = "public, max-age=60"
CHECKPOINT_CACHE = "no-cache, max-age=0"
OCTETS = "application/octet-stream"
MAX_LEAVES = 2**53  # entry seqs are below 2^53 (I-JSON): no tile starts beyond


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
    etag = '"' + hashlib.sha256(data).hexdigest() + '"'
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponseNotModified()
    else:
        response = HttpResponse(data, content_type=OCTETS)
    response["ETag"] = etag
    response["Cache-Control"] = IMMUTABLE if width is None else SHORT_LIVED
    return response
