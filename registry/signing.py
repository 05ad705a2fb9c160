"""Signed submissions: who vouches for a request body (docs/security.md, Signed writes).

A write carries ``X-Chipledger-Signature: <key id>:<base64 Ed25519 signature>``
over the exact body bytes, made with a key registered to the caller's
organisation; the body holds a ``timestamp`` (Unix seconds) and a ``nonce`` so
a captured request cannot be replayed. The ledger keeps body and signature.
"""

from __future__ import annotations

import base64
import hashlib
import re
import time
from dataclasses import dataclass

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

HEADER = "X-Chipledger-Signature"
MAX_SKEW_SECONDS = 300
NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")


class SignatureProblem(ValueError):
    """The request is not validly signed; ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class SignedBody:
    key_id: str
    body: bytes
    signature: bytes
    timestamp: int
    nonce: str

    def submission(self) -> dict:
        """The ledger's record of who said what (docs/ledger.md, Entries: ``submission``)."""
        return {
            "key": self.key_id,
            "body": base64.b64encode(self.body).decode(),
            "sig": base64.b64encode(self.signature).decode(),
        }


def key_id_for(public_key: bytes) -> str:
    return hashlib.sha256(public_key).digest()[:8].hex()


def parse_header(value: str | None) -> tuple[str, bytes]:
    if not value:
        raise SignatureProblem("signature", f"missing {HEADER} header")
    key_id, _, encoded = value.strip().partition(":")
    if not re.fullmatch(r"[0-9a-f]{16}", key_id):
        raise SignatureProblem("signature", "header must be '<16 hex key id>:<base64 signature>'")
    try:
        signature = base64.b64decode(encoded, validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII header
        raise SignatureProblem("signature", "signature is not base64") from None
    if len(signature) != 64:
        raise SignatureProblem("signature", "an Ed25519 signature is 64 bytes")
    return key_id, signature


def verify(public_key: bytes, body: bytes, signature: bytes) -> None:
    try:
        VerifyKey(public_key).verify(body, signature)
    except BadSignatureError:
        raise SignatureProblem("signature", "does not verify over the request body with that key") from None


def check_freshness(data: dict, now: float | None = None) -> tuple[int, str]:
    """The body's (timestamp, nonce), if the timestamp is recent and the nonce well-formed."""
    stamp, nonce = data.get("timestamp"), data.get("nonce")
    if type(stamp) is not int:
        raise SignatureProblem("timestamp", "required: Unix seconds as an integer")
    if abs(stamp) > 2**53:  # the body parser bounds numbers too; never do float arithmetic on a huge int here
        raise SignatureProblem("timestamp", f"must be Unix seconds within {MAX_SKEW_SECONDS} s of the server's clock")
    now = time.time() if now is None else now
    if abs(now - stamp) > MAX_SKEW_SECONDS:
        raise SignatureProblem("timestamp", _skew_reason(stamp, int(now)))
    if type(nonce) is not str or not NONCE_PATTERN.fullmatch(nonce):
        raise SignatureProblem("nonce", "required: 16-64 characters of [A-Za-z0-9_-], never reused")
    return stamp, nonce


def _skew_reason(stamp: int, now: int) -> str:
    """Why a timestamp is refused, with the server's time and the unit, so a client can see what it got wrong."""
    reason = (
        f"{stamp} is {abs(now - stamp):,} s {'ahead of' if stamp > now else 'behind'} the server's clock "
        f"({now} Unix seconds); send Unix seconds within {MAX_SKEW_SECONDS} s of it"
    )
    if abs(now * 1000 - stamp) <= MAX_SKEW_SECONDS * 1000:
        reason += " (this looks like milliseconds)"
    return reason


def sign(key: SigningKey, body: bytes) -> str:
    """The header value for ``body`` (what clients send)."""
    signature = key.sign(body).signature
    return f"{key_id_for(bytes(key.verify_key))}:{base64.b64encode(signature).decode()}"
