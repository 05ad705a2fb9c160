"""The data commitment: RFC 9162 math, the sampler, and provers who choose or invent their batches."""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from replay import Budget, verify
from replay.training import data_commitment as dataset
from replay.training.bundled_data import Batches, bundled
from tests.tlog import naive_merkle
from tlog import merkle

from .. import cheats
from ..helpers import TINY, manifest, record, save_manifest

ALL = Budget(segments=100)


@given(st.integers(1, 70), st.data())
@settings(max_examples=60, deadline=None)
def test_tree_and_proofs_agree_with_the_naive_rfc9162_reference(size, data):
    """The prover's tree (tlog's math over its stored levels) against the RFC's recursive definitions."""
    raw = [bytes([i % 256, i // 256]) for i in range(size)]
    leaves = [merkle.leaf_hash(leaf) for leaf in raw]
    tree = dataset.Tree(leaves)
    assert tree.root == naive_merkle.mth(raw) == merkle.root_from_leaf_hashes(leaves)
    i = data.draw(st.integers(0, size - 1))
    proof = tree.proof(i)
    assert proof == naive_merkle.path(i, raw)
    assert len(proof) == dataset.path_length(i, size)
    assert merkle.verify_inclusion(leaves[i], i, size, proof, tree.root)
    if size > 1:
        j = (i + 1) % size
        assert not merkle.verify_inclusion(leaves[j], i, size, proof, tree.root)
        assert not merkle.verify_inclusion(leaves[i], i, size, proof[:-1], tree.root)


@given(st.integers(0, 2**63 - 1), st.integers(0, 10**5), st.integers(1, 64), st.integers(1, 2**40))
@settings(max_examples=100, deadline=None)
def test_sampler_is_a_function_of_the_commitment_and_in_range(seed, step, batch, size):
    root = hashlib.sha256(b"r").digest()
    idx = dataset.sample(seed, root, step, batch, size)
    assert len(idx) == batch and all(0 <= i < size for i in idx)
    assert idx == dataset.sample(seed, root, step, batch, size)


def test_sampler_draws_each_example_about_equally():
    counts = [0] * 5
    for t in range(400):
        for i in dataset.sample(0, bytes(32), t, 10, 5):
            counts[i] += 1
    assert all(700 < c < 900 for c in counts), counts


def test_honest_batches_check_and_others_do_not():
    b = Batches("mlp", TINY["mlp"]["config"], 8, 3)
    root, size = b.data.tree.root, b.data.size
    batch, proofs = b.draw(5)
    assert dataset.check_batch(batch, proofs, 3, root, size, 5) is None
    assert "not example" in dataset.check_batch(batch, proofs, 3, root, size, 6)  # another step's draw
    batch["x"] = batch["x"].clone()
    batch["x"][2, 0] += 1e-6
    assert "example 2" in dataset.check_batch(batch, proofs, 3, root, size, 5)


def test_gpt_examples_are_rows_of_the_text():
    d = bundled("gpt", TINY["gpt"]["config"], 0)
    assert d.x.shape[1] == TINY["gpt"]["config"]["block"] and torch.equal(d.x[:, 1:], d.y[:, :-1])


@pytest.mark.parametrize("cheat", [cheats.ChosenBatches, cheats.MadeUpBatches])
def test_a_prover_who_chooses_or_invents_its_batches_is_rejected(tmp_path, cheat):
    d = record(tmp_path / "t", "mlp", recorder=cheat)
    v = verify(d, d / "claims.json", ALL)
    assert v.verdict == "rejected"
    assert "is not the committed sampler's" in " ".join(v.reasons), v.reasons


def test_inputs_outside_the_declared_range_are_refused(tmp_path):
    cfg, b = TINY["mlp"]["config"], TINY["mlp"]["batch"]
    data = bundled("mlp", cfg, 0)
    data = dataset.Committed(data.x, data.y, "blobs", [-1.0, 1.0])  # declares less than it holds
    d = record(tmp_path / "t", "mlp", batches=Batches("mlp", cfg, b, 0, data))
    v = verify(d, d / "claims.json", ALL)
    assert v.verdict == "malformed" and "outside the declared dataset.x_range" in v.reasons[0]


def test_the_steering_inputs_cannot_even_be_declared(tmp_path):
    """Values near 2^64: a range that holds them is refused before anything runs."""
    d = record(tmp_path / "t", "mlp")
    m = manifest(d)
    m["dataset"]["x_range"] = [-(2.0**64), 2.0**64]
    save_manifest(d, m)
    v = verify(d, d / "claims.json", ALL)
    assert v.verdict == "malformed" and "dataset.x_range" in v.reasons[0]
