"""RFC 9162 §2.1 Merkle tree math: hashes, compact ranges, proofs.

Pure functions, no Django. A node id ``(level, index)`` names the perfect
subtree over leaves ``[index << level, (index + 1) << level)``. The database
keeps only such complete subtrees, so every proof here is assembled from
complete-subtree hashes, reading O(log n) of them:

1. ``inclusion_ranges`` / ``consistency_ranges`` say which leaf ranges the
   RFC proof consists of (straight from PATH / SUBPROOF),
2. ``nodes_for_ranges`` turns them into node ids (one DB query),
3. ``hashes_for_ranges`` folds the looked-up hashes into proof hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

NodeId = tuple[int, int]

HASH_SIZE = 32
EMPTY_ROOT: bytes = hashlib.sha256(b"").digest()

_sha256 = hashlib.sha256


def leaf_hash(leaf: bytes) -> bytes:
    """SHA-256(0x00 ‖ leaf): the 0x00 prefix separates leaves from nodes."""
    return _sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 ‖ left ‖ right)."""
    return _sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly below n (n >= 2): RFC 9162's k."""
    return 1 << ((n - 1).bit_length() - 1)


# --- compact ranges -----------------------------------------------------------


def range_nodes(begin: int, end: int) -> list[NodeId]:
    """Decompose [begin, end) into maximal aligned perfect subtrees, left to right."""
    if begin < 0 or end < begin:
        raise ValueError(f"invalid range [{begin}, {end})")
    nodes = []
    while begin < end:
        # The node may be no larger than begin's alignment allows, nor than what is left.
        level = (end - begin).bit_length() - 1
        if begin:
            level = min(level, (begin & -begin).bit_length() - 1)
        nodes.append((level, begin >> level))
        begin += 1 << level
    return nodes


def frontier_nodes(size: int) -> list[NodeId]:
    """The perfect subtrees covering [0, size): one per set bit of size."""
    return range_nodes(0, size)


def fold_range(hashes: list[bytes]) -> bytes:
    """Hash of a range from its range_nodes hashes (right-to-left fold).

    For [0, size), and for any right-edge RFC subtree [a, n) with a aligned to a
    power of two >= n - a, this equals RFC 9162's MTH: the split point k is
    always the boundary after the first (largest) node.
    """
    if not hashes:
        return EMPTY_ROOT
    acc = hashes[-1]
    for h in reversed(hashes[:-1]):
        acc = _sha256(b"\x01" + h + acc).digest()
    return acc


# --- appending ----------------------------------------------------------------


def append_leaves(
    frontier: list[bytes], size: int, leaf_hashes: list[bytes]
) -> tuple[list[bytes], list[tuple[int, int, bytes]]]:
    """Append leaf hashes to the tree whose frontier (frontier_nodes(size)) is given.

    Returns the frontier for size + len(leaf_hashes) and every newly completed
    node of level >= 1 as (level, index, hash), in completion order.
    """
    if size < 0 or len(frontier) != size.bit_count():
        raise ValueError(f"frontier has {len(frontier)} hashes; size {size} needs {max(size, 0).bit_count()}")
    stack = list(frontier)
    nodes: list[tuple[int, int, bytes]] = []
    extend_frontier(stack, size, leaf_hashes, nodes)
    return stack, nodes


def extend_frontier(
    stack: list[bytes], size: int, leaf_hashes: Iterable[bytes], nodes: list[tuple[int, int, bytes]] | None = None
) -> int:
    """Fold leaf hashes into the frontier ``stack`` of a tree of ``size`` leaves, in place; returns the new size.

    With ``nodes``, every completed node of level >= 1 is appended to it as (level, index, hash).
    """
    pop, push, sha = stack.pop, stack.append, _sha256
    for h in leaf_hashes:
        # Each trailing 1-bit of the leaf's index is a left sibling waiting on the stack.
        i, level = size, 0
        while i & 1:
            h = sha(b"\x01" + pop() + h).digest()
            i >>= 1
            level += 1
            if nodes is not None:
                nodes.append((level, i, h))
        push(h)
        size += 1
    return size


def root(frontier: list[bytes]) -> bytes:
    """Tree root from the frontier hashes."""
    return fold_range(frontier)


def root_from_leaf_hashes(leaf_hashes: list[bytes]) -> bytes:
    """MTH over the given leaf hashes, in O(n) time and O(log n) memory."""
    stack: list[bytes] = []
    extend_frontier(stack, 0, leaf_hashes)
    return fold_range(stack)


# --- proofs as leaf ranges ----------------------------------------------------


def inclusion_ranges(index: int, size: int) -> list[tuple[int, int]]:
    """Leaf ranges whose hashes make PATH(index, D[0:size]), in proof order (leaf upward)."""
    if not 0 <= index < size:
        raise ValueError(f"index {index} out of range for tree size {size}")
    ranges = []
    begin, end = 0, size
    while end - begin > 1:
        mid = begin + _split(end - begin)
        if index < mid:
            ranges.append((mid, end))
            end = mid
        else:
            ranges.append((begin, mid))
            begin = mid
    ranges.reverse()  # built root-down; the proof lists the leaf's sibling first
    return ranges


def consistency_ranges(first: int, second: int) -> list[tuple[int, int]]:
    """Leaf ranges whose hashes make PROOF(first, D[0:second]) (RFC 9162 §2.1.4.1)."""
    if first < 0 or second < first:
        raise ValueError(f"invalid consistency sizes first={first} second={second}")
    if first == 0 or first == second:
        return []
    ranges = []
    begin, end, whole = 0, second, True  # whole: SUBPROOF's b flag
    # Invariant: begin < first <= end, so end - begin >= 2 while end != first.
    while end != first:
        mid = begin + _split(end - begin)
        if first <= mid:
            ranges.append((mid, end))
            end = mid
        else:
            ranges.append((begin, mid))
            begin, whole = mid, False
    if not whole:
        ranges.append((begin, end))  # SUBPROOF(m, D[m], false) = {MTH(D[m])}
    ranges.reverse()
    return ranges


def nodes_for_ranges(ranges: Iterable[tuple[int, int]]) -> list[NodeId]:
    """Distinct node ids needed to hash the ranges; level 0 means an entry's leaf hash."""
    seen: dict[NodeId, None] = {}
    for begin, end in ranges:
        for node in range_nodes(begin, end):
            seen[node] = None
    return list(seen)


def hashes_for_ranges(ranges: Iterable[tuple[int, int]], lookup: Mapping[NodeId, bytes]) -> list[bytes]:
    """Proof hashes from node hashes looked up by nodes_for_ranges ids (KeyError if missing)."""
    return [fold_range([lookup[n] for n in range_nodes(b, e)]) for b, e in ranges]


# --- verification (never raises) ---------------------------------------------


def _is_hash(h: object) -> bool:
    return isinstance(h, bytes) and len(h) == HASH_SIZE


def _is_size(n: object) -> bool:
    return type(n) is int and n >= 0


def verify_inclusion(leaf_hash: bytes, index: int, size: int, proof: list[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: does proof show leaf_hash at index in the tree (size, root)?"""
    if not (_is_size(index) and _is_size(size) and index < size):
        return False
    if not (_is_hash(leaf_hash) and _is_hash(root) and isinstance(proof, (list, tuple))):
        return False
    if not all(_is_hash(p) for p in proof):
        return False
    fn, sn, r = index, size - 1, leaf_hash
    for p in proof:
        if sn == 0:
            return False  # proof longer than the path
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                # fn is the last node of its level: skip levels where it has no sibling.
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, proof: list[bytes], first_root: bytes, second_root: bytes) -> bool:
    """RFC 9162 §2.1.4.2: is the tree (second, second_root) an extension of (first, first_root)?"""
    if not (_is_size(first) and _is_size(second) and first <= second and isinstance(proof, (list, tuple))):
        return False
    if first == 0:
        return len(proof) == 0  # the empty tree is a prefix of every tree
    if first == second:
        return len(proof) == 0 and _is_hash(first_root) and first_root == second_root
    if not (proof and _is_hash(first_root) and _is_hash(second_root) and all(_is_hash(p) for p in proof)):
        return False
    if first & (first - 1) == 0:
        proof = [first_root, *proof]  # first tree is a perfect subtree: its root is the start node
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = proof[0]
    for c in proof[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == first_root and sr == second_root
