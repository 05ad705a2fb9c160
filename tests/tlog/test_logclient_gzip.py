"""The tiles client asks for gzip and reads it safely (tlog/logclient.py): bounded, one whole member, only
the encodings it knows. A server that gzips entry bundles is read the same as one that does not."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tlog import tiles
from tlog.logclient import FetchError, LogClient, _decoded

BUNDLE = tiles.encode_bundle([b"leaf %d" % i * 20 for i in range(256)])


def test_identity_and_gzip_bodies_read_the_same():
    assert _decoded("u", BUNDLE, "", len(BUNDLE)) == BUNDLE
    assert _decoded("u", gzip.compress(BUNDLE, mtime=0), "GZIP ", len(BUNDLE)) == BUNDLE


@pytest.mark.parametrize(
    ("body", "encoding", "refused"),
    [
        (gzip.compress(bytes(50_000_000)), "gzip", "larger than"),  # 50 MB of zeros in 49 KB: never inflated whole
        (gzip.compress(BUNDLE)[:-9], "gzip", "cut short"),
        (gzip.compress(BUNDLE) + gzip.compress(b"more"), "gzip", "more than one member"),
        (b"not gzip at all", "gzip", "bad gzip body"),
        (BUNDLE, "br", "unsupported Content-Encoding"),
        (BUNDLE + b"x", "identity", "larger than"),
    ],
)
def test_a_body_that_is_not_one_bounded_gzip_member_is_refused(body, encoding, refused):
    with pytest.raises(FetchError, match=refused):
        _decoded("u", body, encoding, len(BUNDLE))


@pytest.fixture
def gzip_server():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Accept-Encoding"))
            body = gzip.compress(BUNDLE, mtime=0)
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    server.shutdown()
    server.server_close()


def test_the_client_asks_for_gzip_and_reads_a_gzipped_bundle(gzip_server):
    url, seen = gzip_server
    leaves = LogClient.mirror_only([url]).bundle(0, None)
    assert leaves == tiles.decode_bundle(BUNDLE) and seen == ["gzip, identity"]
