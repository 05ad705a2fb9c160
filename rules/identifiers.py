"""The registry's identifier forms and request bounds: pure, shared by the services and the EPCIS parser.

Every pattern is matched whole (``fullmatch``: ``$`` would let a trailing newline through) and
spelled with ASCII classes (``\\d`` and ``\\S`` take fullwidth digits and other Unicode look-alikes).
"""

import re

MAX_CHIPS = 10_000  # chips in one request (one ledger entry)
SERIAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
COUNTRY = re.compile(r"[A-Z]{2}")
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
SYSTEM = "system"  # the actor of entries no organisation made
