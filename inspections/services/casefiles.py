"""Private case text behind a salted commitment (``CaseText``): the ledger carries the commitment, never the text."""

from __future__ import annotations

import hashlib
import secrets

from ..models import CaseText

PREFIX = "sha256:"


def case_commitment(salt: bytes, text: str) -> str:
    """``sha256:`` + hex SHA-256(salt ‖ UTF-8 text): anyone shown the salt and the text can check the entry."""
    return PREFIX + hashlib.sha256(bytes(salt) + text.encode("utf-8")).hexdigest()


def case_text_commit(text: str) -> str:
    """Store ``text`` privately and return its commitment; empty text stays empty (nothing to hide)."""
    if not text:
        return ""
    salt = secrets.token_bytes(32)
    commitment = case_commitment(salt, text)
    CaseText.objects.create(commitment=commitment, salt=salt, text=text)
    return commitment
