"""The ledger's leaves: the one place leaf bytes are made, and their streaming verifier.

Pure, no Django: shared by ``manage.py verify_ledger`` and ``python -m tlog.log_verifier``.
A leaf is the RFC 8785 (JCS) canonical JSON of
``{"v":1,"seq":N,"time":…,"kind":…,"actor":…,"payload":{…},"prev":<hex>}`` plus an
optional ``"submission":{"key","body","sig"}``; ``prev`` chains each leaf to the
hash of the one before.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import rfc8785

from tlog import merkle

try:  # orjson is several times faster than json for the million-entry sweep
    import orjson
except ImportError:  # pragma: no cover - exercised only where orjson is absent
    orjson = None

GENESIS_PREV = "0" * 64

_REQUIRED = frozenset({"v", "seq", "time", "kind", "actor", "payload", "prev"})
_ALL = _REQUIRED | {"submission"}
_SUBMISSION = frozenset({"key", "body", "sig"})
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TIME = re.compile(
    r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]{1,9})?Z"
)

# Fast canonical check. RFC 8785 treats numbers as IEEE doubles. For strings,
# integers within ±2^53 (OPT_STRICT_INTEGER raises beyond) and keys without
# non-BMP characters (JCS sorts keys by UTF-16 code units, orjson by code
# points), orjson's sorted compact output is byte-identical to JCS, escapes
# included (tests/tlog/test_chain.py checks every code point). Leaves without
# floats or non-BMP characters are checked with orjson; others go to rfc8785.
_ORJSON_OPTS = (orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER) if orjson else 0
_MAX_SEQ = 2**53  # beyond this JCS cannot tell integers apart
_NON_BMP = re.compile(rb"[\xf0-\xf4]")  # lead bytes of 4-byte UTF-8 sequences


def format_time(when: datetime) -> str:
    """RFC 3339 UTC with microseconds: the exact text in the leaf."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LedgerFault(Exception):
    """The first thing wrong with a ledger: entry ``where`` (a seq) is bad because ``reason``.

    ``where`` is a seq, or a word naming what is not an entry ("checkpoint"). The one
    failure type of every ledger check: the chain, ``verify_ledger`` and ``python -m tlog.log_verifier``.
    """

    def __init__(self, where: int | str, reason: str):
        super().__init__(f"{self._where(where)}: {reason}")
        self.where = where
        self.reason = reason

    def __reduce__(self):  # raised in a worker process, re-raised by the parent
        return type(self), (self.where, self.reason)

    @staticmethod
    def _where(where: int | str) -> str:
        return f"seq={where}" if isinstance(where, int) else str(where)

    @property
    def seq(self) -> int | None:
        return self.where if isinstance(self.where, int) else None

    def line(self) -> str:
        return f"FAIL {self._where(self.where)}: {self.reason}"


def _fields_error(obj: dict, check_prev: bool = True) -> str | None:
    """Why the parsed leaf's members are not the contract's, or None.

    check_prev=False skips prev's hex format: the chain verifier compares it exactly.
    """
    n = len(obj)
    if not ((n == 7 or (n == 8 and "submission" in obj)) and _REQUIRED.issubset(obj)):
        missing, unknown = sorted(_REQUIRED - obj.keys()), sorted(obj.keys() - _ALL)
        return f"leaf members wrong: missing {missing}, unknown {unknown}"
    v, seq, time, prev = obj["v"], obj["seq"], obj["time"], obj["prev"]
    if type(v) is not int or v != 1:
        return f"unsupported leaf version v={v!r}"
    if type(seq) is not int or not 0 <= seq < _MAX_SEQ:
        return f"leaf seq {seq!r} is not an integer in [0, 2^53)"
    if type(time) is not str or not _TIME.fullmatch(time):
        return f"leaf time {time!r} is not RFC 3339 UTC"
    if type(obj["kind"]) is not str or not obj["kind"]:
        return "leaf kind must be a non-empty string"
    if type(obj["actor"]) is not str or not obj["actor"]:
        return "leaf actor must be a non-empty string"
    if type(obj["payload"]) is not dict:
        return "leaf payload must be an object"
    if type(prev) is not str or (check_prev and not _HEX64.fullmatch(prev)):
        return "leaf prev must be 64 lowercase hex digits"
    if n == 8:
        sub = obj["submission"]
        if type(sub) is not dict or sub.keys() != _SUBMISSION or not all(type(x) is str for x in sub.values()):
            return 'leaf submission must be {"key","body","sig"} strings'
    return None


def canonical_leaf(
    seq: int,
    time: str,
    kind: str,
    actor: str,
    payload: dict,
    prev: str,
    submission: dict | None = None,
) -> bytes:
    """The leaf bytes for an entry: RFC 8785 canonical JSON. ValueError if a field is wrong."""
    obj: dict[str, Any] = {
        "v": 1,
        "seq": seq,
        "time": time,
        "kind": kind,
        "actor": actor,
        "payload": payload,
        "prev": prev,
    }
    if submission is not None:
        obj["submission"] = submission
    error = _fields_error(obj)
    if error:
        raise ValueError(error)
    fast = _fast_canonical(obj)
    if fast is not None:
        return fast
    leaf = rfc8785.dumps(obj)
    # Refuse what a verifier would reject: values that do not survive the JSON round trip.
    try:
        survives = is_canonical(leaf, _loads(leaf))
    except ValueError:
        survives = False
    if not survives:
        raise ValueError("payload does not round-trip through canonical JSON (lone surrogate or non-string key?)")
    return leaf


_PLAIN_TYPES = frozenset({str, int, bool, type(None)})


def _fast_canonical(obj: dict) -> bytes | None:
    """orjson's JCS-identical output for plain values (see _ORJSON_OPTS), else None.

    rfc8785 is pure Python (~25 µs a leaf); this keeps appends cheap. Anything
    else — floats, non-BMP text, int subclasses, big integers, lone
    surrogates — takes the rfc8785 path.
    """
    if orjson is None or not _plain_json(obj["payload"]) or not _plain_json(obj.get("submission")):
        return None
    try:
        leaf = orjson.dumps(obj, option=_ORJSON_OPTS)
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 2^53 or a lone surrogate
        return None
    return leaf if leaf.isascii() or not _NON_BMP.search(leaf) else None


def _plain_json(obj: Any) -> bool:
    """Only dicts with str keys, lists, str, int, bool and None, all the way down."""
    stack = [obj]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict:
            if not all(type(key) is str for key in node):
                return False
            stack.extend(node.values())
        elif kind is list:
            stack.extend(node)
        elif kind not in _PLAIN_TYPES:
            return False
    return True


def _loads(leaf: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(leaf)
        except orjson.JSONDecodeError:
            pass  # fall through: the stdlib decides, so error text does not depend on orjson
    return json.loads(leaf)


def is_canonical(leaf: bytes, obj: Any) -> bool:
    """Is leaf exactly the RFC 8785 form of its own JSON value? obj: leaf, parsed."""
    return _canonical(leaf, obj, obj)


def _canonical(leaf: bytes, obj: Any, numbers: Any) -> bool:
    """is_canonical, where only `numbers` (part of obj) may hold floats."""
    if orjson is not None and (leaf.isascii() or not _NON_BMP.search(leaf)) and _no_floats(numbers):
        try:
            return orjson.dumps(obj, option=_ORJSON_OPTS) == leaf
        except TypeError:
            pass  # an integer beyond 2^53, or a lone surrogate from the stdlib parser
    return _jcs_equal(leaf)


def _no_floats(obj: Any) -> bool:
    """No float anywhere in obj (iterative walk: leaves may nest deeply)."""
    if type(obj) is not dict and type(obj) is not list:
        return type(obj) is not float
    stack = [obj]
    while stack:
        node = stack.pop()
        for value in node.values() if type(node) is dict else node:
            kind = type(value)
            if kind is dict or kind is list:
                stack.append(value)
            elif kind is float:
                return False
    return True


def _jcs_equal(leaf: bytes) -> bool:
    """The definition: parse with every number as a double (as JCS does), re-serialise, compare."""
    try:
        return rfc8785.dumps(json.loads(leaf, parse_int=float)) == leaf
    except Exception:  # invalid JSON, NaN, lone surrogates, rfc8785 domain errors
        return False


class ChainVerifier:
    """Feed leaves in seq order; each is checked, hashed, chained and added to the tree.

    Start from genesis, or mid-ledger from a trusted (seq, prev hash, frontier).
    """

    BATCH = 4096  # leaf hashes buffered before folding them into the frontier

    def __init__(self, start_seq: int = 0, prev_hash: bytes = bytes(32), frontier: list[bytes] | None = None):
        if start_seq < 0 or len(prev_hash) != 32:
            raise ValueError("start_seq must be >= 0 and prev_hash 32 bytes")
        if frontier is None and start_seq == 0:
            frontier = []
        if frontier is not None and len(frontier) != start_seq.bit_count():
            raise ValueError(f"frontier for size {start_seq} needs {start_seq.bit_count()} hashes")
        self.size = start_seq  # entries verified so far (= next expected seq)
        self._prev = bytes(prev_hash).hex()
        self._frontier = list(frontier) if frontier is not None else None
        self._tree_size = start_seq
        self._pending: list[bytes] = []

    def feed(self, seq: int, leaf: bytes, digest: bytes | None = None) -> tuple[bytes, dict]:
        """Check the leaf of entry seq; return (leaf hash, parsed leaf). Raises LedgerFault.

        ``digest``: the leaf's hash, if the caller computed it already (from these very bytes)."""
        expected = self.size
        if seq != expected:
            # Reported at the expected seq: that is the first position where the ledger is wrong.
            why = "gap: entries missing" if seq > expected else "duplicate or out of order"
            raise LedgerFault(expected, f"expected seq {expected}, got seq {seq} ({why})")
        if type(leaf) is not bytes:
            leaf = bytes(leaf)  # psycopg hands bytea back as memoryview
        if digest is None:
            digest = merkle.leaf_hash(leaf)
        try:
            obj = _loads(leaf)
        except ValueError:
            raise LedgerFault(seq, "leaf is not valid JSON") from None
        except RecursionError:
            raise LedgerFault(seq, "leaf is not valid JSON (nested too deeply)") from None
        if type(obj) is not dict:
            raise LedgerFault(seq, "leaf is not a JSON object")
        error = _fields_error(obj, check_prev=False)
        if error:
            raise LedgerFault(seq, error)
        if obj["seq"] != seq:
            raise LedgerFault(seq, f"leaf says seq {obj['seq']}")
        if obj["prev"] != self._prev:
            what = f"hash of seq {seq - 1}" if seq else "genesis (64 zeros)"
            raise LedgerFault(seq, f"prev does not match {what}")
        if not _canonical(leaf, obj, obj["payload"]):  # _fields_error vetted the other members
            raise LedgerFault(seq, "leaf is not RFC 8785 canonical JSON")
        self._prev = digest.hex()
        self.size = seq + 1
        if self._frontier is not None:
            self._pending.append(digest)
            if len(self._pending) >= self.BATCH:
                self._flush()
        return digest, obj

    def _flush(self) -> None:
        # Batched: one Python call per BATCH leaves instead of per leaf.
        self._tree_size = merkle.extend_frontier(self._frontier, self._tree_size, self._pending)
        self._pending = []

    @property
    def prev_hash(self) -> bytes:
        """Leaf hash of the last verified entry (32 zero bytes before genesis)."""
        return bytes.fromhex(self._prev)

    def frontier(self) -> list[bytes]:
        """Hashes of merkle.frontier_nodes(size): enough to resume verification later."""
        if self._frontier is None:
            raise ValueError("no frontier: verification started mid-ledger without one")
        self._flush()
        return list(self._frontier)

    def root(self) -> bytes:
        """RFC 9162 root of the tree of all entries fed so far (including the start)."""
        return merkle.root(self.frontier())
