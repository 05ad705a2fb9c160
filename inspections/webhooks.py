"""The alert webhook's signature (docs/regulator.md, Case handling): HMAC-SHA256 under a shared secret over
``<timestamp>.<body>``, sent as ``Chipledger-Signature: t=<unix seconds>,v1=<hex>``. Standard library only, so a
receiver may copy ``webhook_verify`` as it stands."""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "Chipledger-Signature"
TOLERANCE_SECONDS = 300  # a receiver refuses older (or future) timestamps: a captured request cannot be replayed later


class SignatureInvalid(ValueError):
    """The request was not signed with the shared secret, or not recently."""


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit() also admits '²', which int() refuses


def webhook_signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header value for ``body`` sent at ``timestamp`` (unix seconds)."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def webhook_verify(secret: str, header: str, body: bytes, now: float, tolerance: int = TOLERANCE_SECONDS) -> int:
    """The signed timestamp when ``header`` signs the exact ``body`` bytes under ``secret`` within ``tolerance``
    seconds of ``now``; else SignatureInvalid saying why."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if not _ascii_digits(fields.get("t", "")) or "v1" not in fields:
        raise SignatureInvalid("the header is not t=<unix seconds>,v1=<hex>")
    timestamp = int(fields["t"])
    if abs(now - timestamp) > tolerance:
        raise SignatureInvalid(f"the timestamp is {now - timestamp:.0f} s from now (at most {tolerance} s)")
    expected = webhook_signature(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), f"t={timestamp},v1={fields['v1']}".encode()):
        raise SignatureInvalid("the signature does not match the body")
    return timestamp
