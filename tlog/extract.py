"""A ledger extract: the entries concerning one organisation or campaign, each with its RFC 9162 inclusion proof
against one signed checkpoint, checked offline with the log's key alone (no Django, no network).

    {"format": "chipledger-extract/1",
     "subject": {"organisation": "<slug>"} | {"campaign": "<slug>"},
     "key": "<the log's verifier key>",
     "checkpoint": "<the signed checkpoint note, with any witness cosignatures>",
     "entries": [{"seq": N, "leaf": "<base64 leaf bytes>", "proof": ["<base64 hash>", ...]}, ...],
     "newer": <entries about the subject appended after the checkpoint, left out: they have no proof yet>,
     "older": <entries about the subject left out because the extract keeps only the latest ones>}

``check_extract`` proves that every entry listed is in the log the checkpoint signs, at its seq, with exactly
these bytes, and that it concerns the subject. It cannot prove that no entry was left out: that needs the
whole log (``python -m tlog.log_verifier --url``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field

from tlog import merkle, note
from tlog.chain import LedgerFault

FORMAT = "chipledger-extract/1"
SUBJECTS = ("organisation", "campaign")


def build_extract(
    subject: dict, key: str, checkpoint: str, entries: list[tuple[int, bytes, list[bytes]]], newer: int, older: int = 0
) -> dict:
    """The extract document for ``(seq, leaf, proof)`` entries proved against ``checkpoint`` (signed by ``key``)."""
    return {
        "format": FORMAT,
        "subject": subject,
        "key": key,
        "checkpoint": checkpoint,
        "entries": [
            {
                "seq": seq,
                "leaf": base64.b64encode(leaf).decode(),
                "proof": [base64.b64encode(h).decode() for h in proof],
            }
            for seq, leaf, proof in entries
        ],
        "newer": newer,
        "older": older,
    }


@dataclass
class ExtractReport:
    subject: str
    entries: int
    size: int
    root: str  # hex
    origin: str
    cosignatures: list[str] = field(default_factory=list)  # names of the witnesses whose cosignature verified

    def line(self) -> str:
        return f"OK extract {self.subject} entries={self.entries} checkpoint size={self.size} root={self.root}"


def concerns(subject: dict, kind: str, actor: str, payload) -> bool:
    """Whether an entry is about the subject: an organisation it was made by or names anywhere in its payload, or a
    campaign's own entries (``campaign.created`` by slug, the others by ``campaign``)."""
    if "campaign" in subject:
        slug = subject["campaign"]
        return isinstance(payload, dict) and (
            payload.get("campaign") == slug or (kind == "campaign.created" and payload.get("slug") == slug)
        )
    slug = subject.get("organisation")
    return actor == slug or slug in _strings(payload)


def _strings(value) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set(value) | {s for item in value.values() for s in _strings(item)}
    if isinstance(value, list):
        return {s for item in value for s in _strings(item)}
    return set()


def check_extract(extract, pinned_key: str | None = None, witnesses: list[str] = (), quorum: int = 0) -> ExtractReport:
    """Check an extract (the parsed JSON document). Raises LedgerFault naming the first problem."""
    if not isinstance(extract, dict) or extract.get("format") != FORMAT:
        raise LedgerFault("extract", f"not a {FORMAT} document")
    subject = _subject(extract.get("subject"))
    key = extract.get("key")
    if not isinstance(key, str):
        raise LedgerFault("extract", "no key")
    if pinned_key is not None and pinned_key.strip() != key.strip():
        raise LedgerFault("checkpoint", f"the extract's key {key!r} is not the pinned key {pinned_key.strip()!r}")
    text = extract.get("checkpoint")
    try:
        checkpoint = note.open_checkpoint(text, note.parse_verifier_key(key.strip()))[1]
    except (note.NoteError, ValueError, TypeError, AttributeError) as err:
        raise LedgerFault("checkpoint", f"the extract's checkpoint does not verify: {err}") from err
    cosigned = _cosigners(text, witnesses)
    if len(cosigned) < quorum:
        raise LedgerFault("checkpoint", f"{len(cosigned)} valid witness cosignature(s), quorum is {quorum}")
    entries = extract.get("entries")
    if not isinstance(entries, list):
        raise LedgerFault("extract", "entries must be a list")
    last = -1
    for item in entries:
        last = _check_entry(item, last, checkpoint, subject)
    name = next(iter(subject))
    return ExtractReport(
        f"{name}:{subject[name]}", len(entries), checkpoint.size, checkpoint.root.hex(), checkpoint.origin, cosigned
    )


def _subject(subject) -> dict:
    if not isinstance(subject, dict) or len(subject) != 1 or next(iter(subject)) not in SUBJECTS:
        raise LedgerFault("extract", f"the subject must name one of {list(SUBJECTS)}")
    if not isinstance(next(iter(subject.values())), str):
        raise LedgerFault("extract", "the subject's slug must be a string")
    return subject


def _cosigners(text: str, witnesses: list[str]) -> list[str]:
    body, signatures = note.split_note(text)
    found = []
    for vkey in witnesses:
        try:
            witness = note.parse_verifier_key(vkey.strip())
        except (note.NoteError, ValueError) as err:
            raise LedgerFault("checkpoint", f"witness key {vkey!r} is not a valid verifier key: {err}") from err
        for sig in signatures:
            if sig.name == witness.name and sig.key_id == witness.key_id:
                try:
                    note.verify_cosignature(body, sig, witness)
                except (note.NoteError, ValueError):
                    continue
                found.append(witness.name)
                break
    return found


def _check_entry(item, last: int, checkpoint: note.Checkpoint, subject: dict) -> int:
    seq = item.get("seq") if isinstance(item, dict) else None
    if type(seq) is not int or seq <= last:
        raise LedgerFault("extract", f"entries must be objects in increasing seq order (after {last}: {seq!r})")
    if seq >= checkpoint.size:
        raise LedgerFault(seq, f"is not in the signed tree of size {checkpoint.size}")
    try:
        leaf = base64.b64decode(item.get("leaf", ""), validate=True)
        proof = [base64.b64decode(h, validate=True) for h in item.get("proof", [])]
    except (TypeError, ValueError, binascii.Error) as err:
        raise LedgerFault(seq, "leaf or proof is not base64") from err
    if not merkle.verify_inclusion(merkle.leaf_hash(leaf), seq, checkpoint.size, proof, checkpoint.root):
        raise LedgerFault(seq, f"the leaf is not in the signed tree of size {checkpoint.size} (inclusion proof fails)")
    try:  # a leaf the log signed is JSON of bounded depth; anything else fails here, never with a traceback
        parsed = json.loads(leaf)
        about = isinstance(parsed, dict) and concerns(
            subject, parsed.get("kind"), parsed.get("actor"), parsed.get("payload")
        )
    except (ValueError, RecursionError) as err:
        raise LedgerFault(seq, "the leaf is not a JSON entry") from err
    if not isinstance(parsed, dict) or parsed.get("seq") != seq:
        raise LedgerFault(seq, f"the leaf says seq {parsed.get('seq') if isinstance(parsed, dict) else None!r}")
    if not about:
        raise LedgerFault(seq, f"the entry does not concern {subject}")
    return seq
