"""The registry's identifier forms and request bounds: pure, shared by the services and the EPCIS parser.

Every pattern is matched whole (``fullmatch``: ``$`` would let a trailing newline through) and
spelled with ASCII classes (``\\d`` and ``\\S`` take fullwidth digits and other Unicode look-alikes).
"""

import re

# Chips in one request (one ledger entry). The entry, carrying the signed body too, must fit a C2SP
# tlog-tiles entry (ledger.services.MAX_LEAF_BYTES, 65,535 bytes): 64 chips with the longest identifiers
# and a 32 KiB signed body make a 63,883-byte leaf (tests/ledger/test_tiles.py).
MAX_CHIPS = 64
SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
COUNTRY = re.compile(r"[A-Z]{2}")
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
SYSTEM = "system"  # the actor of entries no organisation made
