"""Naive RFC 9162 §2.1 reference, written straight from the RFC's recursive definitions.

Deliberately independent of tlog.merkle: its own hashing, its own k, recursion
over lists of raw leaves. Slow (O(n) per call) and obviously correct.
"""

import hashlib


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) — §2.1.1."""
    n = len(leaves)
    if n == 0:
        return _h(b"")
    if n == 1:
        return _h(b"\x00" + leaves[0])
    k = _k(n)
    return _h(b"\x01" + mth(leaves[:k]) + mth(leaves[k:]))


def path(m: int, leaves: list[bytes]) -> list[bytes]:
    """PATH(m, D[n]) — §2.1.3.1."""
    n = len(leaves)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return path(m, leaves[:k]) + [mth(leaves[k:])]
    return path(m - k, leaves[k:]) + [mth(leaves[:k])]


def proof(m: int, leaves: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) — §2.1.4.1 (for 0 < m <= n)."""
    return _subproof(m, leaves, True)


def _subproof(m: int, leaves: list[bytes], b: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if b else [mth(leaves)]
    k = _k(n)
    if m <= k:
        return _subproof(m, leaves[:k], b) + [mth(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [mth(leaves[:k])]
