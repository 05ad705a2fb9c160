"""The committed dataset and the batch sampler: the prover cannot choose what a step trains on.

The manifest's `dataset` commits to the training examples: `root`, the RFC 9162 Merkle tree head
over `size` examples, and `x_range`, the closed interval every input value lies in (float inputs;
token ids are bounded by the architecture's vocab instead). Example i's leaf bytes are its x then
its y, each the little-endian bytes of the tensor (dtype and per-example shape from the manifest's
`batch`, without the batch dimension); leaf hash SHA-256(0x00 ‖ bytes), node SHA-256(0x01 ‖ l ‖ r).

The batch of step t is a function of the commitment alone (`sample`): SHA-256 in counter mode over
"chipledger-batch/1" ‖ seed (8 bytes LE) ‖ root (32 bytes) ‖ step (8 bytes LE) ‖ counter (8 bytes
LE); each digest gives four 64-bit little-endian words, and a word v becomes index v mod size unless
v >= 2^64 - (2^64 mod size) (rejection: no index is favoured). Indices are drawn with replacement, in
order, until the batch is full. The transcript carries, for each step, the examples and an inclusion
proof of each (the hashes of RFC 9162's PATH, leaf sibling first, concatenated).

The tree math is RFC 9162 §2.1 from ``tlog.merkle``, the same as the ledger's (replay may import the
pure ``tlog``, never a Django app: docs/ARCHITECTURE.md, Parts).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from tlog.merkle import (
    fold_range,
    frontier_nodes,
    hashes_for_ranges,
    inclusion_ranges,
    leaf_hash,
    node_hash,
    verify_inclusion,
)

DOMAIN = b"chipledger-batch/1"
MAX_SIZE = 1 << 40
MAX_INPUT = 65536.0  # |x_range| cap: the steering construction needs inputs near 2^64 (docs/transcripts.md)
HASH = 32


def example_bytes(x: torch.Tensor, y: torch.Tensor) -> bytes:
    """Leaf bytes of one example: x then y, little-endian, C order."""
    out = b""
    for t in (x, y):
        a = t.detach().cpu().numpy()
        out += np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    return out


def sample(seed: int, root: bytes, step: int, batch: int, size: int) -> list[int]:
    """The example indices of step `step` (see the module docstring)."""
    if not 1 <= size <= MAX_SIZE:
        raise ValueError(f"dataset size must be in [1, {MAX_SIZE}]")
    limit = (1 << 64) - (1 << 64) % size
    prefix = DOMAIN + seed.to_bytes(8, "little") + root + step.to_bytes(8, "little")
    out, counter = [], 0
    while len(out) < batch:
        block = hashlib.sha256(prefix + counter.to_bytes(8, "little")).digest()
        counter += 1
        for j in range(0, HASH, 8):
            v = int.from_bytes(block[j : j + 8], "little")
            if v < limit and len(out) < batch:
                out.append(v % size)
    return out


def path_length(index: int, size: int) -> int:
    """Number of hashes in RFC 9162's PATH(index, D[0:size])."""
    return len(inclusion_ranges(index, size))


class Tree:
    """The prover's whole tree: the hash of every perfect subtree, level by level, looked up by node id
    (level, index); ``tlog.merkle`` assembles the root and any PATH from them, as the ledger does from its
    stored nodes."""

    def __init__(self, leaves: list[bytes]):
        if not leaves:
            raise ValueError("a dataset needs at least one example")
        self.size = len(leaves)
        self.levels = [list(leaves)]
        while len(self.levels[-1]) > 1:
            lv = self.levels[-1]
            self.levels.append([node_hash(lv[i], lv[i + 1]) for i in range(0, len(lv) - 1, 2)])
        self.root = fold_range([self[node] for node in frontier_nodes(self.size)])

    def __getitem__(self, node: tuple[int, int]) -> bytes:
        level, index = node
        return self.levels[level][index]

    def proof(self, index: int) -> list[bytes]:
        return hashes_for_ranges(inclusion_ranges(index, self.size), self)


class Committed:
    """A dataset of examples (x[i], y[i]) with its Merkle tree: what the prover holds."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, name: str, x_range: list[float] | None):
        self.x, self.y, self.name, self.x_range = x.contiguous(), y.contiguous(), name, x_range
        self.tree = Tree([leaf_hash(example_bytes(x[i], y[i])) for i in range(len(y))])
        self.size = len(y)

    def commitment(self) -> dict:
        return {"name": self.name, "root": self.tree.root.hex(), "size": self.size, "x_range": self.x_range}

    def draw(self, seed: int, step: int, batch: int) -> tuple[dict[str, torch.Tensor], bytes]:
        """The batch of `step` and the concatenated inclusion proofs of its examples."""
        idx = sample(seed, self.tree.root, step, batch, self.size)
        proofs = b"".join(b"".join(self.tree.proof(i)) for i in idx)
        t = torch.tensor(idx, dtype=torch.long)
        return {"x": self.x[t].contiguous(), "y": self.y[t].contiguous()}, proofs


def check_batch(batch: dict, proofs: bytes, seed: int, root: bytes, size: int, step: int) -> str | None:
    """None if the batch is exactly the sampler's draw from the committed dataset, else why not."""
    n = batch["y"].shape[0]
    idx = sample(seed, root, step, n, size)
    pos = 0
    for row, i in enumerate(idx):
        k = path_length(i, size) * HASH
        proof = [proofs[pos + j : pos + j + HASH] for j in range(0, k, HASH)]
        pos += k
        if len(proof) * HASH != k or not verify_inclusion(
            leaf_hash(example_bytes(batch["x"][row], batch["y"][row])), i, size, proof, root
        ):
            return f"example {row} of the batch is not example {i} of the committed dataset (the sampler's draw)"
    if pos != len(proofs):
        return "inclusion proofs have trailing bytes"
    return None


def proof_bytes(seed: int, root: bytes, step: int, batch: int, size: int) -> int:
    """The exact length of a step's concatenated inclusion proofs."""
    return sum(path_length(i, size) for i in sample(seed, root, step, batch, size)) * HASH
