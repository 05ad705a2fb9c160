"""The log's Ed25519 signing key and its origin: settings, never code (docs/ledger.md, Checkpoints, Origin)."""

import base64
import functools
import logging
import os

from django.conf import settings
from nacl.signing import SigningKey

from tlog import note

from . import selectors

log = logging.getLogger(__name__)


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


def origin() -> str:
    """The log's origin: the one its genesis entry recorded, else (a log not opened yet) ``LEDGER_ORIGIN``.

    The origin is the log's name for life: it is the checkpoints' first line and the name in the verifier
    key, whose key ID hashes it, so witnesses (keyed by origin) and verifiers (pinning the key) would see
    another log under another one. ``LEDGER_ORIGIN`` names a log when it is opened; changing it later
    changes nothing but a warning.
    """
    recorded = selectors.genesis_origin()
    if recorded is None:
        return settings.LEDGER_ORIGIN
    if recorded != settings.LEDGER_ORIGIN:
        _warn_origin_kept(settings.LEDGER_ORIGIN, recorded)
    return recorded


@functools.cache
def _warn_origin_kept(configured: str, recorded: str) -> None:
    log.warning(
        "LEDGER_ORIGIN is %r but this log was opened as %r (its genesis entry): the log keeps %r "
        "(docs/ledger.md, Origin)",
        configured,
        recorded,
        recorded,
    )


def verifier_key() -> str:
    """``<origin>+<hex keyid>+<base64(0x01||pubkey)>``: what outside verifiers pin."""
    return note.verifier_key(origin(), bytes(signing_key().verify_key))
