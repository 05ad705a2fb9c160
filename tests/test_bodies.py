"""Body limits per endpoint (413 before the body is read) and the strict JSON parser."""

import io
import json

import pytest
from django.conf import settings
from django.test import Client
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as hst

from api import request_bodies as bodies
from inspections.services.inspectors import MAX_LOG_BYTES
from rules.identifiers import MAX_CHIPS


@pytest.mark.parametrize(
    "path, limit",
    [
        ("/api/inspections/tasks/7/snapshot-log", bodies.body_limit("/api/inspections/tasks/1/snapshot-log")),
        ("/api/registry/chips/events/fabricate", 32 * bodies.KIB),
        ("/api/ledger/cosignatures", bodies.DEFAULT_LIMIT),
        ("/api/registry/facilities", bodies.DEFAULT_LIMIT),
    ],
)
def test_an_oversized_body_is_a_json_413_naming_the_limit_before_it_is_read(path, limit):
    class Unreadable(io.RawIOBase):
        def read(self, *args):
            raise AssertionError("the body was read")

    response = Client().generic(
        "POST",
        path,
        b"",
        content_type="application/json",
        CONTENT_LENGTH=str(limit + 1),
        **{"wsgi.input": Unreadable()},
    )
    assert response.status_code == 413 and response.json()["limit"] == limit


def test_a_chunked_body_is_cut_off_at_the_limit_while_streaming():
    stream = io.BytesIO(b"x" * (bodies.DEFAULT_LIMIT + 10))
    meta = {"wsgi.input": stream, "wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": "chunked"}
    response = Client().generic("POST", "/api/ledger/cosignatures", b"", content_type="application/json", **meta)
    assert response.status_code == 413 and stream.tell() == bodies.DEFAULT_LIMIT + 1


def test_the_largest_legal_requests_fit_their_limits():
    # a maximal snapshot log, JSON-escaped; 10,000 fabricated chips with the longest identifiers
    record = '{"counter":0,"hash":"%s","prev":"%s","serial":"%s","shard":0,"sig":"%s","time":"2026-01-01T00:00:00Z"}'
    line = record % ("a" * 64, "b" * 64, "S" * 64, "A" * 88)
    log = (line + "\n") * (MAX_LOG_BYTES // (len(line) + 1))
    assert len(json.dumps({"log": log}).encode()) <= bodies.body_limit("/api/inspections/tasks/1/snapshot-log")
    chip = {"serial": "S" * 64, "model": "m" * 64, "public_key": "A" * 44, "facility": "f" * 64}
    body = json.dumps({"timestamp": 1, "nonce": "n" * 64, "chips": [chip] * MAX_CHIPS}, indent=1)
    assert len(body.encode()) <= bodies.body_limit("/api/registry/chips/events/fabricate")
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE >= bodies.LARGEST_LIMIT  # Django's own cap does not undercut


hostile_json = hst.recursive(
    hst.none() | hst.booleans() | hst.integers() | hst.floats() | hst.text(),
    lambda inner: hst.lists(inner, max_size=4) | hst.dictionaries(hst.text(max_size=4), inner, max_size=4),
    max_leaves=40,
)


@given(document=hostile_json)
@hsettings(max_examples=300, deadline=None)
def test_the_parser_accepts_only_what_the_database_and_ledger_hold(document):

    try:
        text = json.dumps(document)
    except ValueError:
        return
    try:
        parsed = bodies.loads(text.encode("utf-8", "surrogatepass"))
    except bodies.BodyProblem as problem:
        assert problem.field and problem.reason
        return
    flat = json.dumps(parsed, allow_nan=False)  # no NaN or infinity got through
    assert "\\u0000" not in flat
    flat.encode("utf-8")  # no lone surrogate got through


@given(
    members=hst.dictionaries(
        hst.text(hst.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=6),
        hst.integers(-9, 9),
        min_size=1,
        max_size=5,
    ),
    repeat=hst.integers(min_value=0),
    depth=hst.integers(0, 3),
)
@hsettings(max_examples=200, deadline=None)
def test_a_member_name_repeated_in_one_object_is_refused_by_name(members, repeat, depth):
    """{"chips":["A"],"chips":["B"]}: a signed body that says two things (readers differ on which wins)."""
    names = list(members)
    again = names[repeat % len(names)]
    text = json.dumps(members)[:-1] + f", {json.dumps(again)}: 0}}"
    for _ in range(depth):
        text = f'{{"outer": [{text}]}}'
    with pytest.raises(bodies.BodyProblem) as problem:
        bodies.loads(text.encode("utf-8", "surrogatepass"))
    assert (problem.value.field, problem.value.reason) == (
        again[:64] or '""',
        "the member appears twice in one object: give it once",
    )
    assert bodies.loads(json.dumps(members)) == members  # once each: read as written


@pytest.mark.parametrize("name", ["a\x00b", "\ud800", "x\udfff"])
def test_a_repeated_member_name_no_answer_can_carry_is_refused_without_naming_it(name):
    """The answer names a repeated member; one that holds a NUL or a lone surrogate is refused as the body's."""
    member = json.dumps(name)  # (escaped: \u0000, \ud800)
    text = f"{{{member}: 1, {member}: 2}}"
    with pytest.raises(bodies.BodyProblem) as problem:
        bodies.loads(text.encode())
    assert (problem.value.field, problem.value.reason) == (
        "body",
        "a member name contains a NUL character or a lone surrogate",
    )
