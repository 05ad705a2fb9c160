"""A client for a chipledger log's public HTTP API (docs/ledger.md, Endpoints): no Django, no database.

Used by ``python -m ledger.verify``, ``python -m inspections.drawaudit`` and ``python -m ledger.witness``.
Entries and the checkpoint are read as C2SP tlog-tiles from the log's ``/tlog/`` prefix and then from
each mirror given, in order (a mirror is any static file server holding a copy of the tiles, or a
``file://`` directory); the key and the proof endpoints from the log's JSON API. Timeouts and bounded
response sizes throughout: neither the log nor a mirror is trusted to behave.
"""

from __future__ import annotations

import base64
import binascii
import functools
import http.client
import json
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from tlog import tiles
from tlog.chain import LedgerFault

DEFAULT_TIMEOUT = 30.0
# Response size limits, in bytes. A page holds at most 1000 entries; leaves carrying signed
# submissions can be a few KiB each.
LIMIT_SMALL = 64 * 1024
LIMIT_PAGE = 64 * 1024 * 1024
PAGE_SIZE = 1000  # entries asked for per request: the API's largest page
USER_AGENT = "chipledger-verify/1"
TILES_PREFIX = "/tlog/"  # where a chipledger log serves tlog-tiles (docs/ledger.md, Tiles)
LIMIT_TILE = tiles.TILE_WIDTH * tiles.HASH_SIZE
LIMIT_BUNDLE = tiles.TILE_WIDTH * (2 + tiles.MAX_ENTRY_BYTES)


class FetchError(Exception):
    """The log could not be read: network failure, HTTP error or a malformed response."""


# ---------------------------------------------------------------------------------------------
# HTTP


class LogClient:
    """The log's public HTTP API, with timeouts and bounded response sizes."""

    def __init__(
        self,
        url: str,
        timeout: float = DEFAULT_TIMEOUT,
        page_size: int = PAGE_SIZE,
        page_limit: int = LIMIT_PAGE,
        mirrors: list[str] | tuple[str, ...] = (),
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.base = url.rstrip("/")
        self.tile_bases = [self.base + TILES_PREFIX] + [_mirror_base(mirror) for mirror in mirrors]
        self.used_mirror = False  # whether any read came from a mirror (the log did not serve it)
        self.timeout = timeout
        self.page_size = page_size
        self.page_limit = page_limit

    @classmethod
    def mirror_only(cls, mirrors: list[str] | tuple[str, ...], timeout: float = DEFAULT_TIMEOUT) -> LogClient:
        """A client reading tiles from these mirrors alone (no log: no key, no proof endpoints)."""
        client = cls("http://unused.invalid", timeout=timeout)
        client.tile_bases = [_mirror_base(mirror) for mirror in mirrors]
        return client

    def _url(self, path: str, params: dict | None = None) -> str:
        url = f"{self.base}/api/ledger/{path}"
        return f"{url}?{urllib.parse.urlencode(params)}" if params else url

    def _open(self, request: urllib.request.Request, limit: int) -> tuple[int, bytes]:
        """Return (status, body) for any HTTP answer; raise FetchError if there is none."""
        status, body, _ = self._exchange(request, limit)
        return status, body

    def _exchange(self, request: urllib.request.Request, limit: int) -> tuple[int, bytes, str]:
        """Return (status, body, Content-Encoding) for any HTTP answer; raise FetchError if there is none.

        ``timeout`` bounds the whole request, not only each read: a server dripping a byte at a time is cut
        off when the deadline passes (its socket is shut down under the blocked read).
        """
        request.add_header("User-Agent", USER_AGENT)
        deadline = _Deadline(self.timeout)
        opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline))
        deadline.start()
        try:
            with opener.open(request, timeout=self.timeout) as resp:
                encoding = resp.headers.get("Content-Encoding", "")
                answer = resp.status, _read_limited(resp, limit, request.full_url), encoding
        except urllib.error.HTTPError as err:
            with err:
                answer = err.code, _read_limited(err, LIMIT_SMALL, request.full_url, truncate=True), ""
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            if deadline.expired:
                raise FetchError(f"{request.full_url}: no complete answer within {self.timeout:g} s") from err
            reason = getattr(err, "reason", err)
            raise FetchError(f"cannot reach {request.full_url}: {reason}") from err
        finally:
            deadline.cancel()
        if deadline.expired:  # the shut-down socket may read as a short, "complete" body: never use it
            raise FetchError(f"{request.full_url}: no complete answer within {self.timeout:g} s")
        return answer

    def _get(self, path: str, params: dict | None = None, limit: int = LIMIT_SMALL) -> bytes:
        request = urllib.request.Request(self._url(path, params), method="GET")
        status, body = self._open(request, limit)
        if not 200 <= status < 300:
            raise FetchError(f"GET {request.full_url}: HTTP {status}: {_snippet(body)}")
        return body

    def _get_json(self, path: str, params: dict | None = None, limit: int = LIMIT_SMALL) -> dict:
        body = self._get(path, params, limit)
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deeply to parse
            raise FetchError(f"GET {self._url(path, params)}: response is not JSON ({type(err).__name__})") from err
        if not isinstance(data, dict):
            raise FetchError(f"GET {self._url(path, params)}: response is not a JSON object")
        return data

    def _get_text(self, path: str) -> str:
        try:
            return self._get(path).decode("utf-8")
        except UnicodeDecodeError as err:
            raise FetchError(f"GET {self._url(path)}: response is not UTF-8") from err

    def key(self) -> str:
        """The log's verifier key, ``<origin>+<hex keyid>+<base64 key>``."""
        return self._get_text("key").strip()

    def checkpoint(self) -> str:
        """The latest signed checkpoint note with its cosignatures: from the log's tiles prefix, else a mirror's."""
        body = self.tile_resource("checkpoint", LIMIT_SMALL)
        if body is None:
            raise FetchError("no source serves a checkpoint: " + ", ".join(self.tile_bases))
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise FetchError("the checkpoint is not UTF-8") from err

    def latest_checkpoint(self) -> str:
        """The log's newest signed checkpoint (``/api/ledger/checkpoint``), cosigned or not: what a witness checks.

        ``checkpoint()`` is the one the log publishes, which may wait for its witnesses' quorum."""
        return self._get_text("checkpoint")

    # --- tlog-tiles -----------------------------------------------------------------

    def tile_resource(self, path: str, limit: int) -> bytes | None:
        """``path`` under the first tiles prefix that serves it (the log, then each mirror in order).

        None if every source answers 404/410; FetchError if none serves it and one failed otherwise.
        """
        errors = []
        for number, base in enumerate(self.tile_bases):
            try:
                body = (
                    _read_file(base, path, limit) if base.startswith("file:") else self._tile_http(base + path, limit)
                )
            except FetchError as err:
                errors.append(str(err))
                continue
            if body is not None:
                self.used_mirror |= number > 0
                return body
        if errors:
            raise FetchError(f"{path}: " + "; ".join(errors))
        return None

    def _tile_http(self, url: str, limit: int) -> bytes | None:
        """GET a tiles resource, asking for gzip (entry bundles compress several times over)."""
        request = urllib.request.Request(url, method="GET", headers={"Accept-Encoding": "gzip, identity"})
        status, body, encoding = self._exchange(request, limit + limit // 64 + 4096)  # gzip's worst-case growth
        if status in (404, 410):
            return None
        if status != 200:
            raise FetchError(f"GET {url}: HTTP {status}: {_snippet(body)}")
        return _decoded(url, body, encoding, limit)

    def tile(self, level: int, index: int, width: int | None) -> bytes:
        """Hash tile ``tile/<level>/<index>[.p/<width>]``; a partial one read from the full tile if dropped."""
        body = self._tile_or_full(tiles.tile_path, (level, index), width, LIMIT_TILE)
        return body if width is None else body[: width * tiles.HASH_SIZE]

    def bundle(self, index: int, width: int | None) -> list[bytes]:
        """The leaves of entry bundle ``index`` (``width`` of them, or 256)."""
        body = self._tile_or_full(tiles.bundle_path, (index,), width, LIMIT_BUNDLE)
        try:
            leaves = tiles.decode_bundle(body)
        except ValueError as err:
            raise LedgerFault(index * tiles.TILE_WIDTH, f"entry bundle {index} is malformed: {err}") from err
        count = width or tiles.TILE_WIDTH
        if len(leaves) < count or (width is None and len(leaves) != count):
            raise LedgerFault(index * tiles.TILE_WIDTH + len(leaves), f"entry bundle {index} has {len(leaves)} entries")
        return leaves[:count]

    def _tile_or_full(self, make_path, where: tuple, width: int | None, limit: int) -> bytes:
        body = self.tile_resource(make_path(*where, width), limit)
        if body is None and width is not None:  # the log may drop a partial tile once the full one exists
            body = self.tile_resource(make_path(*where, None), limit)
        if body is None:
            raise FetchError(f"no source serves {make_path(*where, width)}")
        return body

    def iter_leaves(self, start: int, end: int, tree_size: int):
        """``(seq, leaf bytes)`` for start <= seq < end, from the entry bundles of the tree of ``tree_size``."""
        if not 0 <= start <= end <= tree_size:
            raise ValueError(f"invalid range [{start}, {end}) of a tree of {tree_size}")
        seq = start
        while seq < end:
            index = seq // tiles.TILE_WIDTH
            width = tiles.tile_width(tree_size, 0, index)
            leaves = self.bundle(index, None if width == tiles.TILE_WIDTH else width)
            for leaf in leaves[seq - index * tiles.TILE_WIDTH : min(width, end - index * tiles.TILE_WIDTH)]:
                yield seq, leaf
                seq += 1

    def entries(self, start: int, end: int) -> list[dict]:
        """One page of entries with start <= seq < end; the server may return fewer."""
        data = self._get_json("entries", {"start": start, "end": end}, self.page_limit)
        entries = data.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise FetchError("entries: response has no list of entry objects")
        return entries

    def iter_entries(self, start: int, end: int):
        """Every entry with start <= seq < end, in order, a page at a time.

        The server may answer a page with fewer entries than asked; paging goes on from there.
        An empty page before ``end`` means the log withholds entries it has signed for.
        """
        seq = start
        while seq < end:
            asked = min(end, seq + self.page_size)
            page = self.entries(seq, asked)
            if not page:
                raise LedgerFault(seq, "log returned no entry for a seq below the checkpoint size")
            for entry in page:
                if seq >= asked:
                    raise LedgerFault(seq, "log returned more entries than requested")
                yield seq, entry
                seq += 1

    def inclusion_proof(self, index: int, size: int) -> list[bytes]:
        data = self._get_json("proof/inclusion", {"index": index, "size": size})
        if data.get("index") != index or data.get("size") != size:
            raise FetchError(f"inclusion proof: answered for another index/size: {data!r:.200}")
        return _proof_hashes(data, "inclusion proof")

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        data = self._get_json("proof/consistency", {"first": first, "second": second})
        if data.get("first") != first or data.get("second") != second:
            raise FetchError(f"consistency proof: answered for other sizes: {data!r:.200}")
        return _proof_hashes(data, "consistency proof")

    def submit_cosignature(self, checkpoint: str, cosignature: str) -> tuple[int, object]:
        """POST a witness cosignature. Returns (HTTP status, decoded JSON body or text)."""
        payload = json.dumps({"checkpoint": checkpoint, "cosignature": cosignature}).encode()
        request = urllib.request.Request(
            self._url("cosignatures"),
            data=payload,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        status, body = self._open(request, LIMIT_SMALL)
        try:
            return status, json.loads(body)
        except (ValueError, RecursionError):
            return status, body.decode("utf-8", "replace")


def _decoded(url: str, body: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent (identity) or gunzipped: at most ``limit`` bytes, one whole gzip member."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise FetchError(f"{url}: response larger than {limit} bytes")
        return body
    if encoding != "gzip":
        raise FetchError(f"{url}: unsupported Content-Encoding {encoding!r}")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflate.decompress(body, limit + 1)  # bounded: a small gzip body may inflate to gigabytes
    except zlib.error as err:
        raise FetchError(f"{url}: bad gzip body ({err})") from err
    if len(data) > limit or inflate.unconsumed_tail:
        raise FetchError(f"{url}: response larger than {limit} bytes once gunzipped")
    if not inflate.eof or inflate.unused_data:
        raise FetchError(f"{url}: gzip body cut short or of more than one member")
    return data


def _mirror_base(url: str) -> str:
    """A mirror's tiles prefix, ending in '/'. http(s), or file:// for a local copy of the tiles."""
    parts = urllib.parse.urlsplit(url)
    if (parts.scheme in ("http", "https") and parts.netloc) or (parts.scheme == "file" and parts.path):
        return url.rstrip("/") + "/"
    raise ValueError(f"not an http(s) or file:// mirror URL: {url!r}")


@functools.lru_cache(maxsize=64)
def _local_directory(base: str) -> str:
    """The directory of a file:// tiles prefix (parsed once: an audit reads thousands of files under it)."""
    return str(Path(urllib.request.url2pathname(urllib.parse.urlsplit(base).path)))


def _read_file(base: str, path: str, limit: int) -> bytes | None:
    local = os.path.join(_local_directory(base), path)
    try:
        with open(local, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise FetchError(f"{local}: larger than {limit} bytes")
            body = handle.read(size + 1)  # read(n) allocates n bytes; a file that grew meanwhile is caught below
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as err:
        raise FetchError(f"cannot read {local}: {err}") from err
    if len(body) > limit:
        raise FetchError(f"{local}: larger than {limit} bytes")
    return body


class _Deadline:
    """Shuts the current connection's socket down when the request's total time is up."""

    def __init__(self, seconds: float):
        self.sock: socket.socket | None = None
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _tracked(base: type[http.client.HTTPConnection], deadline: _Deadline) -> type[http.client.HTTPConnection]:
    class Connection(base):
        def connect(self):
            super().connect()
            deadline.sock = self.sock
            if deadline.expired:  # connected just as time ran out
                deadline._expire()

    return Connection


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_tracked(http.client.HTTPConnection, self.deadline), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(_tracked(http.client.HTTPSConnection, self.deadline), req, context=self._context)


def _read_limited(resp, limit: int, url: str, truncate: bool = False) -> bytes:
    # read(n) allocates n bytes up front: ask for no more than the announced length (bundles may be 16 MiB).
    announced = resp.headers.get("Content-Length", "") if resp.headers is not None else ""
    if announced.isascii() and announced.isdigit() and int(announced) < limit:
        body = resp.read(int(announced) + 1)
        return body if len(body) <= limit else _too_large(body, limit, url, truncate)
    body = resp.read(limit + 1)
    if len(body) > limit:
        if truncate:
            return body[:limit]
        raise FetchError(f"{url}: response larger than {limit} bytes")
    return body


def _too_large(body: bytes, limit: int, url: str, truncate: bool) -> bytes:
    if truncate:
        return body[:limit]
    raise FetchError(f"{url}: response larger than {limit} bytes")


def _snippet(body: bytes, n: int = 300) -> str:
    text = body.decode("utf-8", "replace").strip()
    return text if len(text) <= n else text[:n] + "…"


def _proof_hashes(data: dict, what: str) -> list[bytes]:
    hashes = data.get("hashes")
    if not isinstance(hashes, list):
        raise FetchError(f"{what}: no list of hashes")
    try:
        out = [base64.b64decode(h, validate=True) for h in hashes]
    except (TypeError, binascii.Error) as err:
        raise FetchError(f"{what}: a hash is not base64") from err
    if any(len(h) != 32 for h in out):
        raise FetchError(f"{what}: a hash is not 32 bytes")
    return out
