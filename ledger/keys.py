"""The log's Ed25519 signing key: a setting, never code (docs/ledger.md, Checkpoints)."""

import base64
import functools
import os

from django.conf import settings
from nacl.signing import SigningKey

from tlog import note


def _load_or_create_seed() -> bytes:
    if settings.LEDGER_SIGNING_KEY:
        return base64.b64decode(settings.LEDGER_SIGNING_KEY, validate=True)
    path = settings.LEDGER_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two processes starting at once must not write two different keys.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return base64.b64decode(path.read_text().strip(), validate=True)
    with os.fdopen(fd, "w") as handle:
        seed = bytes(SigningKey.generate())
        handle.write(base64.b64encode(seed).decode() + "\n")
    return seed


@functools.cache
def signing_key() -> SigningKey:
    seed = _load_or_create_seed()
    if len(seed) != 32:
        raise ValueError("the ledger signing key must be a base64 32-byte Ed25519 seed")
    return SigningKey(seed)


def verifier_key() -> str:
    """``<origin>+<hex keyid>+<base64(0x01||pubkey)>``: what outside verifiers pin."""
    return note.verifier_key(settings.LEDGER_ORIGIN, bytes(signing_key().verify_key))
