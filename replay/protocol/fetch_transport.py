"""One file of a prover's transcript into the verifier's copy, within the fetch's budget: over http(s) (redirects
followed, at most ``MAX_REDIRECTS``, each through the address check of pinned_http.py) or from a local share
(opened without following links, safeio.py). Failures raise ``FetchRefused`` naming the file and what failed,
never what a server answered (no body, no headers). Standard library only."""

from __future__ import annotations

import http.client
import os
import urllib.parse
from pathlib import Path

from replay.protocol.fetch_limits import FetchBudget, FetchRefused
from replay.protocol.pinned_http import open_connection
from replay.protocol.safeio import Refused, open_inside

MAX_REDIRECTS = 3
CHUNK = 1 << 20
SAFE = "/%:@!$&'()*+,;=-._~"
HEADERS = {"User-Agent": "chipledger-replay-fetch/1", "Accept-Encoding": "identity"}


def transcript_base_url(url: str) -> urllib.parse.SplitResult:
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


def get_file(
    base: urllib.parse.SplitResult,
    name: str,
    dest: Path,
    budget: FetchBudget,
    allowed: frozenset[str],
    cap: int | None = None,
) -> None:
    """One file of the transcript into ``dest / name``, following redirects through the address check."""
    budget.take_file(name)
    url = urllib.parse.urlunsplit(base._replace(path=urllib.parse.urljoin(base.path, name)))
    for _hop in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        connection = open_connection(parts, name, budget, allowed)
        try:
            target = urllib.parse.quote(parts.path or "/", safe=SAFE)
            if parts.query:
                target += "?" + urllib.parse.quote(parts.query, safe=SAFE + "?")
            connection.request("GET", target, headers=HEADERS)
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


def _redirect(url: str, location: str | None, name: str) -> str:
    if not location:
        raise FetchRefused(f"{name}: a redirect without a Location")
    target = urllib.parse.urljoin(url, location)
    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
        raise FetchRefused(f"{name}: a redirect to a scheme other than http(s)")
    return target


def _limit(budget: FetchBudget, cap: int | None) -> tuple[int, bool]:
    """(the bytes this file may take, whether that is the fetch's own budget): a file's protocol cap (the manifest's
    32 MiB) is the transcript format's, and a file over it malformed; over the budget, the verifier's limit."""
    if cap is not None and cap <= budget.bytes:
        return cap, False
    return budget.bytes, True


def _save(response, path: Path, name: str, budget: FetchBudget, cap: int | None) -> None:
    limit, ours = _limit(budget, cap)
    declared = response.getheader("Content-Length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise FetchRefused(f"{name}: {int(declared)} bytes, more than the {limit} left to fetch", ours=ours)
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
                raise FetchRefused(f"{name}: more than the {limit} bytes left to fetch", ours=ours)
            out.write(chunk)
    budget.bytes -= size


def copy_local_file(root: Path | int, name: str, dest: Path, budget: FetchBudget, cap: int | None) -> None:
    """One file of a local share, opened without following links (safeio), into ``dest / name``."""
    budget.take_file(name)
    limit, ours = _limit(budget, cap)
    try:
        fd = open_inside(root, name)
    except (
        Refused
    ) as refused:  # a link or a device is a refusal; a missing or unreadable file may be the share's hiccup
        raise FetchRefused(str(refused), transient=refused.transient) from None
    declared = os.fstat(fd).st_size  # (a regular file's: a 50 GB sparse one is refused before a byte is copied)
    if declared > limit:
        os.close(fd)
        raise FetchRefused(f"{name}: {declared} bytes, more than the {limit} left to copy", ours=ours)
    path = dest / name
    path.parent.mkdir(parents=True, exist_ok=True)
    size = 0
    with os.fdopen(fd, "rb") as src, open(path, "wb") as out:
        while True:
            budget.left()
            try:
                chunk = src.read(min(CHUNK, declared + 1 - size))
            except OSError as error:
                raise FetchRefused(f"{name}: the read failed ({type(error).__name__})", transient=True) from None
            if not chunk:
                break
            size += len(chunk)
            if size > declared:  # (the prover's file changed under the copy: its doing, never over a cap of ours)
                raise FetchRefused(f"{name}: it grew while it was copied", transient=True)
            out.write(chunk)
    if size < declared:  # shrank under the copy: a changing share, retried (not a hash mismatch, which is final)
        raise FetchRefused(f"{name}: it shrank while it was copied", transient=True)
    budget.bytes -= size
