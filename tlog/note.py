"""C2SP signed-note, tlog-checkpoint and tlog-cosignature/v1, with Ed25519 (PyNaCl).

Pure functions, no Django. Specs: c2sp.org/signed-note, c2sp.org/tlog-checkpoint,
c2sp.org/tlog-cosignature. Compatible with golang.org/x/mod/sumdb/note.

A note is ``body + "\\n" + signature lines``; the body ends in a newline and a
signature line is ``"— <name> <base64(key id ‖ signature)>\\n"``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

import nacl.exceptions
import nacl.signing

ED25519 = 0x01
COSIGNATURE_V1 = 0x04

MAX_NOTE_BYTES = 1 << 20
MAX_SIGNATURES = 100  # as golang.org/x/mod/sumdb/note; the spec requires accepting at least 16
MAX_TIMESTAMP = (1 << 63) - 1

_EM_DASH = "\u2014 "
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f]")  # ASCII controls other than newline
_HEX_KEY_ID = re.compile(r"[0-9a-f]{8}")
_SIZE = re.compile(r"0|[1-9][0-9]*")


class NoteError(ValueError):
    """A note, key, checkpoint or signature is malformed or does not verify."""


@dataclass(frozen=True)
class Verifier:
    name: str
    sig_type: int
    public_key: bytes
    key_id: bytes


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes  # raw field after the key id; for cosignature/v1: u64 timestamp ‖ 64-byte sig


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


# --- helpers ------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def canonical_b64decode(text: str) -> bytes:
    """Strict standard base64: the bytes whose one spelling text is, else ValueError. b64decode(validate=True) also
    takes a last character whose spare bits are set, a second spelling of the same bytes: where text is hashed or
    signed (a note, a chip's log record) or kept as filed (a chip's key on the ledger), that would be two texts of one
    value. (Also the chip log checker's and the registry's: replay/protocol/firmware.py, rules/identifiers.py.)"""
    if not isinstance(text, str):
        raise ValueError(f"not base64 text but {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):  # (a str that is not ASCII: ValueError)
        raise ValueError(f"bad base64 {text[:40]!r}") from None
    if _b64(raw) != text:  # non-zero padding bits or missing padding
        raise ValueError(f"non-canonical base64 {text[:40]!r}")
    return raw


def _unb64(text: str) -> bytes:
    """Strict standard base64: one encoding per value, so tampered text never decodes equal."""
    try:
        return canonical_b64decode(text)
    except ValueError as err:
        raise NoteError(str(err)) from err


def _check_name(name: str) -> None:
    # Names are separated by spaces in signature lines and by "+" in keys.
    if not isinstance(name, str) or not name or "+" in name or any(c.isspace() for c in name):
        raise NoteError(f"invalid key name {name!r}")
    if _CONTROL.search(name):
        raise NoteError(f"invalid key name {name!r}")


def _check_text(body: str) -> None:
    """A note body: valid UTF-8 text ending in a newline, no control characters but newline."""
    if not isinstance(body, str) or not body.endswith("\n"):
        raise NoteError("note text must end with a newline")
    try:
        body.encode("utf-8")
    except UnicodeEncodeError as err:
        raise NoteError("note text is not valid UTF-8") from err
    if _CONTROL.search(body):
        raise NoteError("note text contains a control character")


# --- keys ---------------------------------------------------------------------


def key_id(name: str, sig_type: int, public_key: bytes) -> bytes:
    """SHA-256(name ‖ "\\n" ‖ type ‖ public key)[:4]; the type byte keeps algorithms apart."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([sig_type]) + public_key).digest()[:4]


def verifier_key(name: str, public_key: bytes, sig_type: int = ED25519) -> str:
    """The vkey string ``<name>+<hex key id>+<base64(type ‖ public key)>``."""
    _check_name(name)
    if sig_type not in (ED25519, COSIGNATURE_V1) or len(public_key) != 32:
        raise NoteError("verifier keys here are Ed25519 (type 0x01 or 0x04, 32-byte key)")
    public_key = bytes(public_key)
    return f"{name}+{key_id(name, sig_type, public_key).hex()}+{_b64(bytes([sig_type]) + public_key)}"


def parse_verifier_key(vkey: str) -> Verifier:
    """Parse and check a vkey string (key id must match; type 0x01 or 0x04)."""
    if not isinstance(vkey, str):
        raise NoteError("verifier key must be a string")
    name, _, rest = vkey.partition("+")
    hex_id, _, key64 = rest.partition("+")  # base64 may itself contain "+"
    _check_name(name)
    if not _HEX_KEY_ID.fullmatch(hex_id):
        raise NoteError(f"verifier key id {hex_id!r} is not 8 lowercase hex digits")
    raw = _unb64(key64)
    if len(raw) != 33:
        raise NoteError(f"verifier key material is {len(raw)} bytes, want 33")
    sig_type, public_key = raw[0], raw[1:]
    if sig_type not in (ED25519, COSIGNATURE_V1):
        raise NoteError(f"unsupported signature type 0x{sig_type:02x}")
    kid = bytes.fromhex(hex_id)
    if key_id(name, sig_type, public_key) != kid:
        raise NoteError("verifier key id does not match name and key")
    return Verifier(name, sig_type, public_key, kid)


# --- checkpoints --------------------------------------------------------------


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    """The tlog-checkpoint note text: origin, decimal size, base64 root."""
    if not isinstance(origin, str) or not origin or "\n" in origin or _CONTROL.search(origin):
        raise NoteError(f"invalid origin {origin!r}")
    if type(size) is not int or size < 0:
        raise NoteError(f"invalid tree size {size!r}")
    if not isinstance(root, bytes) or len(root) != 32:
        raise NoteError("root must be 32 bytes")
    return f"{origin}\n{size}\n{_b64(root)}\n"


def parse_checkpoint(body: str) -> Checkpoint:
    """Parse checkpoint note text strictly; extension lines are kept, never interpreted."""
    _check_text(body)
    lines = body[:-1].split("\n")
    if len(lines) < 3:
        raise NoteError("checkpoint needs origin, size and root lines")
    origin, size_text, root64, *extensions = lines
    if not origin:
        raise NoteError("checkpoint origin is empty")
    if not _SIZE.fullmatch(size_text) or len(size_text) > 20 or int(size_text) >= 1 << 64:
        raise NoteError(f"checkpoint size {size_text[:40]!r} is not a canonical decimal")
    root = _unb64(root64)
    if len(root) != 32:
        raise NoteError(f"checkpoint root is {len(root)} bytes, want 32")
    if any(not line for line in extensions):
        raise NoteError("checkpoint extension lines must be non-empty")
    return Checkpoint(origin, int(size_text), root, tuple(extensions))


def open_checkpoint(text: str, verifier: Verifier) -> tuple[str, Checkpoint]:
    """Verify a signed checkpoint note with the log's key and parse it: (body, checkpoint).

    The origin must be the key's name (C2SP tlog-checkpoint). Raises NoteError.
    """
    body = verify_note(text, verifier)
    checkpoint = parse_checkpoint(body)
    if checkpoint.origin != verifier.name:
        raise NoteError(f"checkpoint origin {checkpoint.origin!r} is not the key's name {verifier.name!r}")
    return body, checkpoint


# --- notes --------------------------------------------------------------------


def signature_line(name: str, key_id: bytes, signature: bytes) -> str:
    """``"— <name> <base64(key id ‖ signature)>\\n"``."""
    _check_name(name)
    if len(key_id) != 4 or not signature:
        raise NoteError("a signature needs a 4-byte key id and a non-empty signature")
    return f"{_EM_DASH}{name} {_b64(bytes(key_id) + bytes(signature))}\n"


def sign_note(body: str, name: str, key: nacl.signing.SigningKey) -> str:
    """Sign body with an Ed25519 note signature (type 0x01); returns the full note."""
    _check_text(body)
    sig = key.sign(body.encode("utf-8")).signature
    kid = key_id(name, ED25519, bytes(key.verify_key))
    return body + "\n" + signature_line(name, kid, sig)


def split_note(text: str) -> tuple[str, list[Signature]]:
    """Split a note into its body (with final newline) and parsed signature lines."""
    if not isinstance(text, str):
        raise NoteError("note must be a string")
    if len(text) > MAX_NOTE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_NOTE_BYTES:
        raise NoteError(f"note is larger than {MAX_NOTE_BYTES} bytes")
    _check_text(text)
    # The body ends at the *last* blank line; bodies may contain blank lines themselves.
    cut = text.rfind("\n\n")
    if cut < 0:
        raise NoteError("note has no blank line before its signatures")
    body, block = text[: cut + 1], text[cut + 2 :]
    if not block:
        raise NoteError("note has no signature lines")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"note has more than {MAX_SIGNATURES} signatures")
    return body, [_parse_signature_line(line) for line in lines]


def _parse_signature_line(line: str) -> Signature:
    if not line.startswith(_EM_DASH):
        raise NoteError(f"signature line does not start with an em dash: {line[:40]!r}")
    name, sep, sig64 = line[len(_EM_DASH) :].partition(" ")
    if not sep:
        raise NoteError(f"signature line has no signature: {line[:40]!r}")
    _check_name(name)
    raw = _unb64(sig64)
    if len(raw) < 5:
        raise NoteError("signature is too short")
    return Signature(name, raw[:4], raw[4:])


def verify_note(text: str, verifier: Verifier) -> str:
    """Return the note's body if it carries a valid signature by verifier.

    Signature lines from other keys are ignored (spec: key rotation, witnesses),
    but a line claiming verifier's name and key id that fails rejects the note.
    """
    body, signatures = split_note(text)
    mine = [s for s in signatures if s.name == verifier.name and s.key_id == verifier.key_id]
    if not mine:
        raise NoteError(f"no signature by {verifier.name}+{verifier.key_id.hex()}")
    for sig in mine:
        if verifier.sig_type == COSIGNATURE_V1:
            verify_cosignature(body, sig, verifier)
        else:
            _verify_ed25519(verifier, body.encode("utf-8"), sig.signature)
    return body


def _verify_ed25519(verifier: Verifier, message: bytes, signature: bytes) -> None:
    if len(signature) != 64:
        raise NoteError(f"Ed25519 signature is {len(signature)} bytes, want 64")
    try:
        nacl.signing.VerifyKey(verifier.public_key).verify(message, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, TypeError) as err:
        raise NoteError(f"invalid signature by {verifier.name}+{verifier.key_id.hex()}") from err


def add_signature_lines(note_text: str, lines: list[str]) -> str:
    """Append signature lines to a note; a new line replaces one with the same name and key id."""
    body, old = split_note(note_text)
    new = [_parse_signature_line(line[:-1] if line.endswith("\n") else line) for line in lines]
    replaced = {(s.name, s.key_id) for s in new}
    kept = [s for s in old if (s.name, s.key_id) not in replaced]
    text = body + "\n" + "".join(signature_line(s.name, s.key_id, s.signature) for s in kept + new)
    split_note(text)  # the result must still be a valid note (size and signature limits)
    return text


# --- cosignature/v1 -------------------------------------------------------------


def _cosigned_message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode("ascii") + body.encode("utf-8")


def cosign(body: str, name: str, key: nacl.signing.SigningKey, timestamp: int) -> str:
    """A cosignature/v1 line (type 0x04) over a checkpoint body at POSIX time timestamp."""
    parse_checkpoint(body)  # a cosigner vouches for checkpoints only
    if type(timestamp) is not int or not 0 <= timestamp <= MAX_TIMESTAMP:
        raise NoteError(f"invalid cosignature timestamp {timestamp!r}")
    sig = key.sign(_cosigned_message(body, timestamp)).signature
    kid = key_id(name, COSIGNATURE_V1, bytes(key.verify_key))
    return signature_line(name, kid, timestamp.to_bytes(8, "big") + sig)


def verify_cosignature(body: str, sig: Signature, verifier: Verifier) -> int:
    """Check a cosignature/v1 over body; return its timestamp."""
    if verifier.sig_type != COSIGNATURE_V1:
        raise NoteError(f"verifier {verifier.name} is not a cosignature/v1 key")
    if sig.name != verifier.name or sig.key_id != verifier.key_id:
        raise NoteError(f"signature is not by {verifier.name}+{verifier.key_id.hex()}")
    if len(sig.signature) != 72:
        raise NoteError(f"cosignature is {len(sig.signature)} bytes, want 72")
    timestamp = int.from_bytes(sig.signature[:8], "big")
    if timestamp > MAX_TIMESTAMP:
        raise NoteError("cosignature timestamp exceeds 2^63-1")
    _check_text(body)
    _verify_ed25519(verifier, _cosigned_message(body, timestamp), sig.signature[8:])
    return timestamp
