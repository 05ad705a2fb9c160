"""The registry's identifier forms and request bounds: pure, shared by the services and the EPCIS parser.

Every pattern is matched whole (``fullmatch``: ``$`` would let a trailing newline through) and
spelled with ASCII classes (``\\d`` and ``\\S`` take fullwidth digits and other Unicode look-alikes).
"""

import re

from tlog.note import canonical_b64decode

# Chips in one request (one ledger entry). The entry, carrying the signed body too, must fit a C2SP
# tlog-tiles entry (ledger.services.MAX_LEAF_BYTES, 65,535 bytes): 64 chips with the longest identifiers
# and a 32 KiB signed body make a 63,883-byte leaf (tests/ledger/test_tiles.py).
MAX_CHIPS = 64
SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
COUNTRY = re.compile(r"[A-Z]{2}")
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
CHIP_KEY_BYTES = 32  # an Ed25519 public key's
SYSTEM = "system"  # the actor of entries no organisation made


def is_chip_public_key(value) -> bool:
    """A chip's Ed25519 public key as filed: 32 bytes in base64's one canonical spelling (padded, spare bits zero). The
    ledger keeps the key's text as filed, and a verifier reading it refuses any other spelling of the same bytes."""
    try:
        return len(canonical_b64decode(value)) == CHIP_KEY_BYTES
    except ValueError:
        return False
