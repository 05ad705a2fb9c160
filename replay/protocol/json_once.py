"""JSON whose objects name each member once: what the verifier reads from a prover (claims, chip keys, chip log
lines, safetensors headers) and the prover's own --config.

`{"hash": "A", "hash": "B"}` is one document to Python's parser (the last member wins) and another to a parser
that keeps the first, or refuses: an outside verifier could then read a different claim, or a different signed
chip record, than ours. Refused here, naming the member, so every reader sees one document or none. No torch and
no Django: the firmware's log check imports it."""

from __future__ import annotations

import json


class MemberTwice(ValueError):
    """An object names `name` more than once."""

    def __init__(self, name: str):
        super().__init__(f"member {name[:64]!r} appears twice in one object")
        self.name = name


def loads(text: str):
    """json.loads(text), refusing an object that names a member twice (MemberTwice, a ValueError)."""
    return _DECODER.decode(text)


def _members_once(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for name, _ in pairs:
            if name in seen:
                raise MemberTwice(name)
            seen.add(name)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_members_once)  # one, as json.loads keeps its own
