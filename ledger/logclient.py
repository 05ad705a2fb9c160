"""A client for a chipledger log's public HTTP API (DESIGN §3): no Django, no database.

Used by ``python -m ledger.verify`` and ``python -m ledger.witness``. Timeouts and bounded
response sizes throughout: the log is not trusted to behave.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request

from ledger.chain import LedgerFault

DEFAULT_TIMEOUT = 30.0
# Response size limits, in bytes. A page holds at most 1000 entries; leaves carrying signed
# submissions can be a few KiB each.
LIMIT_SMALL = 64 * 1024
LIMIT_PAGE = 64 * 1024 * 1024
PAGE_SIZE = 1000  # entries asked for per request: the API's largest page
USER_AGENT = "chipledger-verify/1"


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
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.base = url.rstrip("/")
        self.timeout = timeout
        self.page_size = page_size
        self.page_limit = page_limit

    def _url(self, path: str, params: dict | None = None) -> str:
        url = f"{self.base}/api/ledger/{path}"
        return f"{url}?{urllib.parse.urlencode(params)}" if params else url

    def _open(self, request: urllib.request.Request, limit: int) -> tuple[int, bytes]:
        """Return (status, body) for any HTTP answer; raise FetchError if there is none.

        ``timeout`` bounds the whole request, not only each read: a server dripping a byte at a time is cut
        off when the deadline passes (its socket is shut down under the blocked read).
        """
        request.add_header("User-Agent", USER_AGENT)
        deadline = _Deadline(self.timeout)
        opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline))
        deadline.start()
        try:
            with opener.open(request, timeout=self.timeout) as resp:
                answer = resp.status, _read_limited(resp, limit, request.full_url)
        except urllib.error.HTTPError as err:
            with err:
                answer = err.code, _read_limited(err, LIMIT_SMALL, request.full_url, truncate=True)
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
        """The latest signed checkpoint note, as served."""
        return self._get_text("checkpoint")

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
    body = resp.read(limit + 1)
    if len(body) > limit:
        if truncate:
            return body[:limit]
        raise FetchError(f"{url}: response larger than {limit} bytes")
    return body


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
