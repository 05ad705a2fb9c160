"""Session-wide tiny transcripts (recorded once, with 1 torch thread), copied by tests that edit them."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when it is imported (on first use, replay/training/kernels.py): the suite runs
    # the device path's kernels through Triton's interpreter (test_kernels.py) where there is no GPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .helpers import record


@pytest.fixture(scope="session")
def transcripts(tmp_path_factory):
    """{(arch, precision): path} recorded lazily, once per session (read, never edited: a test copies one first)."""

    class Lazy(dict):
        def __missing__(self, key):
            arch, precision = key
            self[key] = record(tmp_path_factory.mktemp(f"{arch}-{precision}"), arch, precision)
            return self[key]

    return Lazy()
