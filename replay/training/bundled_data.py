"""Small bundled datasets, generated from a seed (nothing is downloaded), and the batch stream.

blobs: Gaussian clusters for the MLP. shapes: noisy 1-channel images of four pattern classes
(horizontal, vertical, diagonal stripes, checkerboard) for the CNN. text: a tiny char-level corpus
of sentences from a small grammar for the GPT. A dataset is used only by the prover: the batches it
trained on are committed to by a Merkle root (dataset.py) and drawn by the sampler; the transcript
carries the drawn examples with their inclusion proofs, so the verifier never regenerates them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from replay.training.data_commitment import Committed

WORDS = {
    "det": ["the", "a", "every", "one"],
    "noun": ["chip", "model", "ledger", "wafer", "cluster", "auditor", "kernel", "shard"],
    "verb": ["logs", "trains", "signs", "ships", "checks", "hashes", "replays", "counts"],
    "adj": ["small", "honest", "busy", "cold", "signed", "quiet"],
}


def blobs(n: int, dim: int, classes: int, seed: int):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, (classes, dim))
    y = rng.integers(0, classes, n)
    x = centers[y] + rng.normal(0.0, 0.7, (n, dim))
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


def shapes(n: int, side: int, classes: int, seed: int, channels: int = 1):
    rng = np.random.default_rng(seed)
    i, j = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    patterns = [np.sin(i * 1.3), np.sin(j * 1.3), np.sin((i + j) * 0.9), np.sign(np.sin(i * 1.6) * np.sin(j * 1.6))]
    y = rng.integers(0, classes, n)
    x = np.stack([patterns[c % 4] * (1 + c // 4) for c in y])[:, None] + rng.normal(0.0, 0.5, (n, 1, side, side))
    x = np.repeat(x, channels, axis=1)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


def text(chars: int, seed: int) -> tuple[torch.Tensor, str]:
    """(token ids, alphabet): sentences 'the busy chip signs a ledger.' until `chars` long."""
    rng = np.random.default_rng(seed)
    out = []
    while sum(map(len, out)) < chars:
        w = lambda k: WORDS[k][rng.integers(len(WORDS[k]))]
        subject = f"{w('det')} {w('adj')} {w('noun')}" if rng.random() < 0.5 else f"{w('det')} {w('noun')}"
        out.append(f"{subject} {w('verb')} {w('det')} {w('noun')}. ")
    s = "".join(out)[:chars]
    alphabet = "".join(sorted(set("".join(word for words in WORDS.values() for word in words) + " .")))
    ids = torch.tensor([alphabet.index(c) for c in s], dtype=torch.int64)
    return ids, alphabet


ALPHABET_SIZE = len(text(10, 0)[1])


def _range(x: torch.Tensor) -> list[float]:
    """A declared input range holding every value of x (whole numbers, so it reads well in the manifest)."""
    return [float(math.floor(float(x.min()))), float(math.ceil(float(x.max())))]


def bundled(arch: str, config: dict, seed: int, seq: int | None = None) -> Committed:
    """The bundled dataset of an architecture, committed (gpt: rows of seq + 1 tokens, x the first seq)."""
    if arch == "mlp":
        x, y = blobs(4096, config["sizes"][0], config["sizes"][-1], seed)
        return Committed(x, y, "blobs", _range(x))
    if arch == "cnn":
        x, y = shapes(2048, config["image"], config["classes"], seed, config["in_channels"])
        return Committed(x, y, "shapes", _range(x))
    if config["vocab"] < ALPHABET_SIZE:
        raise ValueError(
            f"config.vocab must be at least {ALPHABET_SIZE} for the bundled text (its alphabet), not {config['vocab']}"
        )
    seq = seq or config["block"]
    ids, _ = text(max(20_000, 256 * (seq + 1)), seed)
    rows = ids[: len(ids) // (seq + 1) * (seq + 1)].view(-1, seq + 1)
    return Committed(rows[:, :-1].contiguous(), rows[:, 1:].contiguous(), "text", None)


class Batches:
    """The prover's batch stream: batch t is the sampler's draw (dataset.sample) from the committed dataset."""

    def __init__(self, arch: str, config: dict, batch: int, seed: int, data: Committed | None = None):
        self.batch, self.seed = batch, seed
        self.data = data or bundled(arch, config, seed)

    def draw(self, t: int) -> tuple[dict[str, torch.Tensor], bytes]:
        """(batch of step t, its examples' concatenated inclusion proofs)."""
        return self.data.draw(self.seed, t, self.batch)

    def __call__(self, t: int) -> dict[str, torch.Tensor]:
        return self.draw(t)[0]
