"""Request bodies: one size limit per endpoint, refused before the body is read, and a strict JSON parser.

The limits (bytes) are documented in docs/operations.md; each is sized for the largest legal request of its
endpoint. The parser refuses what the database or the ledger cannot hold, naming where in the document:
nesting deeper than ``MAX_DEPTH``, NUL characters (PostgreSQL text and jsonb refuse them), integers beyond
I-JSON's ±(2^53 − 1) (the ledger's canonical JSON), non-finite numbers (NaN, Infinity, 1e400), and a member
name repeated in one object (RFC 8259 leaves the meaning open: Python keeps the last, other readers the first or
refuse, so a stored signed body would say two things; I-JSON forbids it).
"""

from __future__ import annotations

import io
import json
import math
import re

from django.http import JsonResponse
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

KIB, MIB = 2**10, 2**20
# (path pattern, limit). First match wins; anything else gets DEFAULT_LIMIT.
BODY_LIMITS = [
    # a 5 MiB log (inspectors.MAX_LOG_BYTES) JSON-escaped: its quotes double, so twice that, plus the envelope
    (re.compile(r"/api/inspections/tasks/\d+/snapshot-log"), 10 * MIB + 64 * KIB),
    # the portal's upload form: the 5 MiB file as is, plus the form's other fields
    (re.compile(r"/portal/tasks/\d+/"), 5 * MIB + 64 * KIB),
    # 64 chips a request (rules.identifiers.MAX_CHIPS), ~300 bytes each at most when fabricated; the signed body
    # goes into the ledger entry (base64), which must stay within a tlog-tiles entry (65,535 bytes)
    (re.compile(r"/api/registry/chips/events/"), 32 * KIB),
    # 64 EPCs with their public keys; the same bound on the entry that carries the signed document
    (re.compile(r"/api/epcis/capture"), 32 * KIB),
    # 1,000 claims, each with a location of up to 1,024 characters
    (re.compile(r"/api/inspections/claims"), 4 * MIB),
    # the admin's forms and actions (Django's own default)
    (re.compile(r"/admin/"), int(2.5 * MIB)),
]
DEFAULT_LIMIT = 64 * KIB
LARGEST_LIMIT = max(limit for _, limit in BODY_LIMITS)
MAX_DEPTH = 32
MAX_SAFE_INTEGER = 2**53 - 1


def body_limit(path: str) -> int:
    for pattern, limit in BODY_LIMITS:
        if pattern.match(path):
            return limit
    return DEFAULT_LIMIT


def _too_large(limit: int) -> JsonResponse:
    return JsonResponse(
        {"detail": f"the request body is larger than this endpoint's limit of {limit} bytes", "limit": limit},
        status=413,
    )


class BodyLimitMiddleware:
    """Refuse an oversized body from its Content-Length, before anything reads it; without one (chunked),
    read at most limit + 1 bytes while streaming and refuse if there are more. A NUL character in the path
    or the query string (which no database text column holds) is refused here too."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if "\x00" in request.path_info:
            return JsonResponse({"path": ["contains a NUL character"]}, status=400)
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                return JsonResponse({name.replace("\x00", ""): ["contains a NUL character"]}, status=400)
        limit = body_limit(request.path_info)
        declared = request.META.get("CONTENT_LENGTH")
        if declared:
            try:
                length = int(declared)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number"}, status=400)
            if length > limit:
                return _too_large(limit)
        elif request.META.get("wsgi.input_terminated") and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", ""):
            body = request.META["wsgi.input"].read(limit + 1)
            if len(body) > limit:
                return _too_large(limit)
            request._stream, request.META["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return self.get_response(request)


class BodyProblem(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def loads(body: bytes | str):
    """Parse a request body; raise BodyProblem(field, reason) for anything the system cannot hold."""
    try:
        data = json.loads(body, object_pairs_hook=_object_once)
    except RecursionError:
        raise BodyProblem("body", f"nested deeper than {MAX_DEPTH} levels") from None
    except BodyProblem:
        raise
    except (ValueError, UnicodeDecodeError):  # includes integers over 4,300 digits
        raise BodyProblem("body", "is not valid JSON") from None
    check(data)
    return data


def _object_once(pairs: list) -> dict:
    """An object whose member names are each given once, or BodyProblem naming the repeated one."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen = set()
        for name, _ in pairs:
            if name in seen and ("\x00" in name or not _encodable(name)):  # a name no answer can carry
                raise BodyProblem("body", "a member name contains a NUL character or a lone surrogate")
            if name in seen:
                raise BodyProblem(name[:64] or '""', "the member appears twice in one object: give it once")
            seen.add(name)
    return data


def check(data) -> None:
    """Walk a parsed document without recursion; the first problem names its path, e.g. ``chips[3].serial``.

    Paths are formatted only for containers and on failure: a 10,000-chip body is walked in milliseconds.
    """
    stack = [(data, "", None, 1)]
    while stack:
        value, parent, key, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value or not (value.isascii() or _encodable(value)):
                raise BodyProblem(_path(parent, key), "contains a NUL character or a lone surrogate")
        elif isinstance(value, float):
            if not math.isfinite(value):  # NaN, Infinity, or 1e400 (which Python reads as infinity)
                raise BodyProblem(_path(parent, key), "a number out of range")
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if abs(value) > MAX_SAFE_INTEGER:
                raise BodyProblem(_path(parent, key), f"an integer beyond ±{MAX_SAFE_INTEGER}")
        elif depth > MAX_DEPTH:
            raise BodyProblem(_path(parent, key), f"nested deeper than {MAX_DEPTH} levels")
        elif isinstance(value, dict):
            path = _path(parent, key, "")
            for name, item in value.items():
                if "\x00" in name or not (name.isascii() or _encodable(name)):
                    raise BodyProblem(path or "body", "a member name contains a NUL character or a lone surrogate")
                stack.append((item, path, name, depth + 1))
        elif isinstance(value, list):
            path = _path(parent, key, "")
            stack.extend((item, path, n, depth + 1) for n, item in enumerate(value))


def _path(parent: str, key, root: str = "body") -> str:
    if key is None:
        return parent or root
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if not key:  # an empty member name still gets a path a client can read
        key = '""'
    return f"{parent}.{key}" if parent else key


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class StrictJSONParser(JSONParser):
    """DRF's JSON parser through ``loads``: a 400 naming the field instead of a 500 deep inside a view."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return loads(stream.read())
        except BodyProblem as problem:
            raise ParseError({problem.field: [problem.reason]}) from None
