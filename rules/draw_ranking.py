"""Verifiable random draws (docs/draws.md): commit H(seed), draw against the ledger's root, reveal the seed.

Pure functions, no Django. A chip's rank is HMAC-SHA256(seed, root ‖ campaign ‖ 0x00 ‖ serial):
the 0x00 keeps campaign and serial apart ("c1"+"23" vs "c12"+"3"). The drawn sample is the
``count`` chips of lowest rank. Committing to the seed before the checkpoint exists stops the
regulator from grinding seeds against the root; keeping it secret until after the draw stops the
prover from predicting which chips will be drawn.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
from collections.abc import Iterable

SEED_BYTES = 32


def new_seed() -> bytes:
    return secrets.token_bytes(SEED_BYTES)


def commitment(seed: bytes) -> str:
    """What goes on the ledger before the draw: hex SHA-256 of the seed."""
    return hashlib.sha256(seed).hexdigest()


def rank_prefix(root: bytes, campaign: str) -> bytes:
    """The HMAC message before the serial: root ‖ campaign ‖ 0x00."""
    return root + campaign.encode() + b"\x00"


def hmac_pads(seed: bytes) -> tuple[bytes, bytes]:
    """(K0 ⊕ ipad, K0 ⊕ opad) of RFC 2104 for HMAC-SHA256 with key ``seed``.

    With them a database computes the very same HMAC from its built-in SHA-256:
    SHA256(outer ‖ SHA256(inner ‖ message)) — no crypto extension needed.
    """
    key = hashlib.sha256(seed).digest() if len(seed) > 64 else seed
    key = key.ljust(64, b"\x00")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def rank(seed: bytes, root: bytes, campaign: str, serial: str) -> bytes:
    return hmac.digest(seed, rank_prefix(root, campaign) + serial.encode(), "sha256")


def draw(seed: bytes, root: bytes, campaign: str, serials: Iterable[str], count: int) -> list[str]:
    """The ``count`` serials of lowest rank, in rank order (deterministic for given inputs)."""
    if count <= 0:
        return []
    prefix = rank_prefix(root, campaign)
    return heapq.nsmallest(count, serials, key=lambda serial: hmac.digest(seed, prefix + serial.encode(), "sha256"))
