"""Small bundled datasets, generated from a seed (nothing is downloaded), and the batch stream.

blobs: Gaussian clusters for the MLP. shapes: noisy 1-channel images of four pattern classes
(horizontal, vertical, diagonal stripes, checkerboard) for the CNN. text: a tiny char-level corpus
of sentences from a small grammar for the GPT. A dataset is used only by the prover: the batches it
trained on are stored in the transcript and committed to by hash, so the verifier never
regenerates them.
"""

from __future__ import annotations

import numpy as np
import torch

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


class Batches:
    """The prover's batch stream for an architecture: batch t is a function of (seed, t)."""

    def __init__(self, arch: str, config: dict, batch: int, seed: int):
        self.arch, self.config, self.batch, self.seed = arch, config, batch, seed
        if arch == "mlp":
            self.x, self.y = blobs(4096, config["sizes"][0], config["sizes"][-1], seed)
        elif arch == "cnn":
            self.x, self.y = shapes(2048, config["image"], config["classes"], seed, config["in_channels"])
        else:
            if config["vocab"] < ALPHABET_SIZE:
                raise ValueError(f"gpt vocab must be >= {ALPHABET_SIZE} for the bundled text")
            self.ids, self.alphabet = text(20_000, seed)

    def __call__(self, t: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, t])
        if self.arch == "gpt":
            block = self.config["block"]
            start = torch.from_numpy(rng.integers(0, len(self.ids) - block - 1, self.batch))
            rows = torch.stack([self.ids[s : s + block + 1] for s in start.tolist()])
            return {"x": rows[:, :-1].contiguous(), "y": rows[:, 1:].contiguous()}
        idx = torch.from_numpy(rng.integers(0, len(self.y), self.batch))
        return {"x": self.x[idx].contiguous(), "y": self.y[idx].contiguous()}
