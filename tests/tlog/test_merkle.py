"""tlog.merkle against the naive RFC 9162 reference and published vectors."""

import hashlib
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.tlog import naive_merkle as naive
from tlog import merkle

# --- fixtures: one fixed log of N leaves and every node the DB would hold -------

N = 5000
LEAVES = [b"entry %d " % i + bytes([i % 251]) * (i % 7) for i in range(N)]
LEAF_HASHES = [merkle.leaf_hash(leaf) for leaf in LEAVES]


@cache
def lookup() -> dict[merkle.NodeId, bytes]:
    """All complete subtree hashes of the N-leaf log, as the DB stores them."""
    _, nodes = merkle.append_leaves([], 0, LEAF_HASHES)
    table = {(level, index): h for level, index, h in nodes}
    table.update({(0, i): h for i, h in enumerate(LEAF_HASHES)})
    return table


@cache
def naive_root(size: int) -> bytes:
    return naive.mth(LEAVES[:size])


def inclusion_proof(index: int, size: int) -> list[bytes]:
    ranges = merkle.inclusion_ranges(index, size)
    table = lookup()
    needed = {node: table[node] for node in merkle.nodes_for_ranges(ranges)}
    return merkle.hashes_for_ranges(ranges, needed)  # only the requested nodes are available


def consistency_proof(first: int, second: int) -> list[bytes]:
    ranges = merkle.consistency_ranges(first, second)
    table = lookup()
    needed = {node: table[node] for node in merkle.nodes_for_ranges(ranges)}
    return merkle.hashes_for_ranges(ranges, needed)


def flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --- published vectors (transparency-dev/merkle proof/verify_test.go, RFC 6962 test leaves)

KAT_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
]
KAT_ROOTS = [  # roots for sizes 1..8
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
KAT_INCLUSION = [  # (0-based index, size, proof)
    (0, 1, []),
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
]
KAT_CONSISTENCY = [  # (first, second, proof)
    (1, 1, []),
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        7,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]


def kat_lookup() -> dict[merkle.NodeId, bytes]:
    hashes = [merkle.leaf_hash(leaf) for leaf in KAT_LEAVES]
    _, nodes = merkle.append_leaves([], 0, hashes)
    return {(lv, i): h for lv, i, h in nodes} | {(0, i): h for i, h in enumerate(hashes)}


def test_empty_tree_root_is_sha256_of_nothing():
    want = bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    assert want == merkle.EMPTY_ROOT
    assert merkle.root_from_leaf_hashes([]) == want
    assert merkle.root([]) == want
    assert naive.mth([]) == want


@pytest.mark.parametrize("size", range(1, 9))
def test_published_roots(size):
    hashes = [merkle.leaf_hash(leaf) for leaf in KAT_LEAVES[:size]]
    want = bytes.fromhex(KAT_ROOTS[size - 1])
    assert merkle.root_from_leaf_hashes(hashes) == want
    frontier, _ = merkle.append_leaves([], 0, hashes)
    assert merkle.root(frontier) == want
    assert naive.mth(KAT_LEAVES[:size]) == want  # the reference itself agrees with the vectors


@pytest.mark.parametrize(("index", "size", "hexes"), KAT_INCLUSION)
def test_published_inclusion_proofs(index, size, hexes):
    want = [bytes.fromhex(h) for h in hexes]
    assert merkle.hashes_for_ranges(merkle.inclusion_ranges(index, size), kat_lookup()) == want
    assert naive.path(index, KAT_LEAVES[:size]) == want
    root = bytes.fromhex(KAT_ROOTS[size - 1])
    assert merkle.verify_inclusion(merkle.leaf_hash(KAT_LEAVES[index]), index, size, want, root)


@pytest.mark.parametrize(("first", "second", "hexes"), KAT_CONSISTENCY)
def test_published_consistency_proofs(first, second, hexes):
    want = [bytes.fromhex(h) for h in hexes]
    assert merkle.hashes_for_ranges(merkle.consistency_ranges(first, second), kat_lookup()) == want
    assert naive.proof(first, KAT_LEAVES[:second]) == want
    r1, r2 = bytes.fromhex(KAT_ROOTS[first - 1]), bytes.fromhex(KAT_ROOTS[second - 1])
    assert merkle.verify_consistency(first, second, want, r1, r2)
    if want:
        assert not merkle.verify_consistency(first, second, want, r2, r1)


# --- roots and appends ---------------------------------------------------------


def test_roots_equal_naive_for_every_size_up_to_300():
    frontier: list[bytes] = []
    for size in range(301):
        want = naive_root(size)
        assert merkle.root_from_leaf_hashes(LEAF_HASHES[:size]) == want, size
        assert merkle.root(frontier) == want, size
        # The frontier is exactly the hashes of frontier_nodes(size).
        ids = merkle.frontier_nodes(size)
        assert frontier == [naive.mth(LEAVES[i << lv : (i + 1) << lv]) for lv, i in ids], size
        frontier, _ = merkle.append_leaves(frontier, size, LEAF_HASHES[size : size + 1])


@settings(max_examples=25, deadline=None)
@given(st.integers(301, N))
def test_roots_equal_naive_for_larger_sizes(size):
    assert merkle.root_from_leaf_hashes(LEAF_HASHES[:size]) == naive_root(size)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_append_in_random_batches_matches_naive(data):
    size = data.draw(st.integers(0, 600), label="size")
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=8), label="cuts"))
    frontier, done, emitted = [], 0, []
    for cut in [*cuts, size]:
        frontier, nodes = merkle.append_leaves(frontier, done, LEAF_HASHES[done:cut])
        emitted += nodes
        done = cut
        assert merkle.root(frontier) == naive_root(done)
    # Every newly completed node is reported once, with its true hash, and nothing else.
    ids = [(lv, i) for lv, i, _ in emitted]
    assert len(set(ids)) == len(ids) == size - size.bit_count()
    for lv, i, h in emitted:
        assert lv >= 1 and (i + 1) << lv <= size
        assert h == lookup()[(lv, i)] == naive.mth(LEAVES[i << lv : (i + 1) << lv])


def test_append_checks_frontier_length():
    with pytest.raises(ValueError):
        merkle.append_leaves([], 3, LEAF_HASHES[:1])
    with pytest.raises(ValueError):
        merkle.append_leaves([LEAF_HASHES[0]], 3, LEAF_HASHES[:1])
    with pytest.raises(ValueError):
        merkle.append_leaves([], -1, LEAF_HASHES[:1])


def test_node_ids_cover_ranges_exactly():
    for begin in range(70):
        for end in range(begin, 70):
            nodes = merkle.range_nodes(begin, end)
            pos = begin
            for lv, i in nodes:
                assert i << lv == pos  # contiguous, aligned
                pos += 1 << lv
            assert pos == end
            # Maximal: no two neighbours of equal level would merge into an aligned parent.
            for (l1, i1), (l2, _) in zip(nodes, nodes[1:]):
                assert not (l1 == l2 and i1 % 2 == 0)
    assert merkle.frontier_nodes(13) == [(3, 0), (2, 2), (0, 12)]
    assert merkle.range_nodes(3, 13) == [(0, 3), (2, 1), (2, 2), (0, 12)]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**62), st.integers(0, 2**62))
def test_range_nodes_are_logarithmic(a, b):
    begin, end = min(a, b), max(a, b)
    nodes = merkle.range_nodes(begin, end)
    assert len(nodes) <= 2 * max(end.bit_length(), 1)
    assert sum(1 << lv for lv, _ in nodes) == end - begin


# --- proofs equal the naive PATH / PROOF ----------------------------------------


def test_inclusion_proofs_equal_naive_exhaustively():
    for size in range(1, 65):
        root = naive_root(size)
        for index in range(size):
            proof = inclusion_proof(index, size)
            assert proof == naive.path(index, LEAVES[:size]), (index, size)
            assert merkle.verify_inclusion(LEAF_HASHES[index], index, size, proof, root)


def test_consistency_proofs_equal_naive_exhaustively():
    for second in range(1, 65):
        for first in range(1, second + 1):
            proof = consistency_proof(first, second)
            assert proof == naive.proof(first, LEAVES[:second]), (first, second)
            assert merkle.verify_consistency(first, second, proof, naive_root(first), naive_root(second))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_inclusion_proofs_equal_naive_larger(data):
    size = data.draw(st.integers(65, N), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    proof = inclusion_proof(index, size)
    assert proof == naive.path(index, LEAVES[:size])
    assert merkle.verify_inclusion(LEAF_HASHES[index], index, size, proof, naive_root(size))


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_consistency_proofs_equal_naive_larger(data):
    second = data.draw(st.integers(65, N), label="second")
    first = data.draw(st.integers(1, second), label="first")
    proof = consistency_proof(first, second)
    assert proof == naive.proof(first, LEAVES[:second])
    assert merkle.verify_consistency(first, second, proof, naive_root(first), naive_root(second))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_proofs_read_logarithmically_many_nodes(data):
    size = data.draw(st.integers(1, 2**48), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    first = data.draw(st.integers(0, size), label="first")
    bound = 2 * size.bit_length()
    assert len(merkle.nodes_for_ranges(merkle.inclusion_ranges(index, size))) <= bound
    assert len(merkle.nodes_for_ranges(merkle.consistency_ranges(first, size))) <= bound + 1
    # Only complete subtrees within the tree are ever asked for.
    for lv, i in merkle.nodes_for_ranges(merkle.consistency_ranges(first, size)):
        assert (i + 1) << lv <= size


def test_trivial_consistency_is_empty():
    assert merkle.consistency_ranges(0, 10) == []
    assert merkle.consistency_ranges(7, 7) == []
    assert merkle.verify_consistency(0, 10, [], merkle.EMPTY_ROOT, naive_root(10))
    assert merkle.verify_consistency(7, 7, [], naive_root(7), naive_root(7))
    assert not merkle.verify_consistency(7, 7, [], naive_root(7), naive_root(8))
    assert not merkle.verify_consistency(7, 7, [naive_root(7)], naive_root(7), naive_root(7))
    assert not merkle.verify_consistency(0, 10, [naive_root(10)], merkle.EMPTY_ROOT, naive_root(10))


@pytest.mark.parametrize(
    "call",
    [
        lambda: merkle.inclusion_ranges(5, 5),
        lambda: merkle.inclusion_ranges(0, 0),
        lambda: merkle.inclusion_ranges(-1, 3),
        lambda: merkle.consistency_ranges(3, 2),
        lambda: merkle.consistency_ranges(-1, 2),
        lambda: merkle.range_nodes(3, 2),
        lambda: merkle.range_nodes(-2, 2),
    ],
)
def test_out_of_range_arguments_raise(call):
    with pytest.raises(ValueError):
        call()


# --- tampering: every bit matters ------------------------------------------------


def inclusion_accepts(leaf, index, size, proof, root):
    return merkle.verify_inclusion(leaf, index, size, proof, root)


@pytest.mark.parametrize(("index", "size"), [(0, 1), (5, 13), (12, 13), (31, 32), (200, 1000)])
def test_inclusion_every_bit_flip_fails(index, size):
    leaf, proof, root = LEAF_HASHES[index], inclusion_proof(index, size), naive_root(size)
    assert inclusion_accepts(leaf, index, size, proof, root)
    for bit in range(256):
        assert not inclusion_accepts(flip(leaf, bit), index, size, proof, root)
        assert not inclusion_accepts(leaf, index, size, proof, flip(root, bit))
        for k in range(len(proof)):
            bad = proof[:k] + [flip(proof[k], bit)] + proof[k + 1 :]
            assert not inclusion_accepts(leaf, index, size, bad, root)


@pytest.mark.parametrize(("first", "second"), [(1, 2), (3, 7), (4, 13), (6, 8), (300, 1000)])
def test_consistency_every_bit_flip_fails(first, second):
    proof, r1, r2 = consistency_proof(first, second), naive_root(first), naive_root(second)
    assert merkle.verify_consistency(first, second, proof, r1, r2)
    for bit in range(256):
        assert not merkle.verify_consistency(first, second, proof, flip(r1, bit), r2)
        assert not merkle.verify_consistency(first, second, proof, r1, flip(r2, bit))
        for k in range(len(proof)):
            bad = proof[:k] + [flip(proof[k], bit)] + proof[k + 1 :]
            assert not merkle.verify_consistency(first, second, bad, r1, r2)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_inclusion_random_bit_flip_fails(data):
    size = data.draw(st.integers(1, 2000), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    proof, root, leaf = inclusion_proof(index, size), naive_root(size), LEAF_HASHES[index]
    bit = data.draw(st.integers(0, 255), label="bit")
    target = data.draw(st.integers(-2, len(proof) - 1), label="target")  # -2 leaf, -1 root
    if target == -2:
        leaf = flip(leaf, bit)
    elif target == -1:
        root = flip(root, bit)
    else:
        proof = proof[:target] + [flip(proof[target], bit)] + proof[target + 1 :]
    assert not merkle.verify_inclusion(leaf, index, size, proof, root)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_consistency_random_bit_flip_fails(data):
    second = data.draw(st.integers(2, 2000), label="second")
    first = data.draw(st.integers(1, second - 1), label="first")
    proof, r1, r2 = consistency_proof(first, second), naive_root(first), naive_root(second)
    bit = data.draw(st.integers(0, 255), label="bit")
    target = data.draw(st.integers(-2, len(proof) - 1), label="target")  # -2 first root, -1 second
    if target == -2:
        r1 = flip(r1, bit)
    elif target == -1:
        r2 = flip(r2, bit)
    else:
        proof = proof[:target] + [flip(proof[target], bit)] + proof[target + 1 :]
    assert not merkle.verify_consistency(first, second, proof, r1, r2)


SOME = hashlib.sha256(b"some other hash").digest()


def reshaped(proof: list[bytes], root: bytes) -> list[list[bytes]]:
    """The transparency-dev probes: truncated, extended, prepended, inserted, malformed."""
    out = [proof + [b""], proof + [root], proof + [SOME], [b""] + proof, [root] + proof, [SOME] + proof]
    if proof:
        out += [proof[:-1], proof[1:], proof[:-1] + [proof[-1][:31]], [proof[0] + b"\x00"] + proof[1:]]
        out += [proof[:1] + [SOME] + proof[1:], [proof[0]] + proof]
    return out


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_inclusion_wrong_shape_index_or_size_fails(data):
    size = data.draw(st.integers(1, 1000), label="size")
    index = data.draw(st.integers(0, size - 1), label="index")
    proof, root, leaf = inclusion_proof(index, size), naive_root(size), LEAF_HASHES[index]
    for bad in reshaped(proof, root):
        assert not merkle.verify_inclusion(leaf, index, size, bad, root)
    for wrong in {index - 1, index + 1, index ^ 2, index ^ 1} - {index}:
        if 0 <= wrong < size:
            assert not merkle.verify_inclusion(leaf, wrong, size, proof, root)
    for wrong in (size * 2, size // 2, index, 0):
        if wrong != size:
            assert not merkle.verify_inclusion(leaf, index, wrong, proof, root)
    assert not merkle.verify_inclusion(LEAF_HASHES[(index + 1) % N], index, size, proof, root)
    assert not merkle.verify_inclusion(leaf, index, size, proof, merkle.EMPTY_ROOT)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_consistency_wrong_shape_or_sizes_fails(data):
    second = data.draw(st.integers(2, 1000), label="second")
    first = data.draw(st.integers(1, second - 1), label="first")
    proof, r1, r2 = consistency_proof(first, second), naive_root(first), naive_root(second)
    assert not merkle.verify_consistency(first, second, [], r1, r2)
    assert not merkle.verify_consistency(first, second, proof, r2, r1)
    for bad in reshaped(proof, r1) + reshaped(proof, r2):
        assert not merkle.verify_consistency(first, second, bad, r1, r2)
    for wrong in (first - 1, first + 1, first ^ 2):
        if 0 < wrong < second and wrong != first:
            assert not merkle.verify_consistency(wrong, second, proof, r1, r2)
    for wrong in (second * 2, second // 2):
        if wrong > first and wrong != second:
            assert not merkle.verify_consistency(first, wrong, proof, r1, r2)


@pytest.mark.parametrize(
    "args",
    [
        (None, 0, 1, [], b"x" * 32),
        (b"x" * 32, 0, 1, None, b"x" * 32),
        (b"x" * 32, 0, 1, [], "not bytes"),
        (b"x" * 32, "0", 1, [], b"x" * 32),
        (b"x" * 32, -1, 1, [], b"x" * 32),
        (b"x" * 32, 1, 1, [], b"x" * 32),
        (b"x" * 32, 0, 0, [], b"x" * 32),
        (b"x" * 31, 0, 1, [], b"x" * 31),
        (b"x" * 32, True, 2, [b"y" * 32], b"x" * 32),
        (b"x" * 32, 0, 2, [123], b"x" * 32),
    ],
)
def test_verify_inclusion_malformed_is_false_not_error(args):
    assert merkle.verify_inclusion(*args) is False


@pytest.mark.parametrize(
    "args",
    [
        (2, 1, [], b"x" * 32, b"x" * 32),
        (-1, 1, [], b"x" * 32, b"x" * 32),
        (1, 2, None, b"x" * 32, b"y" * 32),
        (1, 2, [b"z" * 32], None, b"y" * 32),
        (1, 2, [b"z" * 32], b"x" * 32, b"y" * 31),
        (1, 2, ["z" * 32], b"x" * 32, b"y" * 32),
        (3, 3, [], b"x" * 31, b"x" * 31),
        ("1", 2, [b"z" * 32], b"x" * 32, b"y" * 32),
    ],
)
def test_verify_consistency_malformed_is_false_not_error(args):
    assert merkle.verify_consistency(*args) is False


def test_single_leaf_tree_root_is_leaf_hash():
    h = merkle.leaf_hash(b"data")
    assert merkle.verify_inclusion(h, 0, 1, [], h)
    assert not merkle.verify_inclusion(h, 0, 1, [], b"")
    assert not merkle.verify_inclusion(b"", 0, 1, [], h)
