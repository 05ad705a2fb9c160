"""Session-wide tiny transcripts (recorded once, with 1 torch thread), copied by tests that edit them."""

from __future__ import annotations

import pytest

from .helpers import record


@pytest.fixture(scope="session")
def transcripts(tmp_path_factory):
    """{(arch, precision): path} recorded lazily, once per session."""
    cache = {}

    class Lazy(dict):
        def __missing__(self, key):
            arch, precision = key
            cache[key] = record(tmp_path_factory.mktemp(f"{arch}-{precision}"), arch, precision)
            return cache[key]

    return Lazy()
