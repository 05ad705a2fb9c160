"""Hostile EPCIS documents through the services: a ValidationError naming a path, or a clean capture — never
another exception, and nothing written on a refusal.

Each example mutates a valid document (commissioning, an export, a receipt; tests/registry/epcis_helpers.py) at
a random path: wrong types, members missing or extra, huge numbers, NaN, NUL, lone surrogates, deep nesting,
Unicode look-alikes, trailing newlines. The documents skip the HTTP parser (api/request_bodies.py), which would
refuse some of these values first: the services must hold on their own.
"""

import base64
import copy
from contextlib import contextmanager

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ledger import selectors as ledger_selectors
from ledger import services as ledger_services
from registry import services
from registry.models import Chip, ChipEvent
from rules import epcis_format
from tests.registry.epcis_helpers import (
    commissioned,
    commissioning,
    document,
    epcis_world,
    link,
    receiving,
    sgtin,
    shipping,
)
from tests.registry.factories import new_serials


class Deep(list):
    """A list nested ``depth`` deep; its repr stays short (Hypothesis prints failing examples)."""

    def __repr__(self):
        return f"<list nested {self.depth} deep>"


class DeepDict(dict):
    def __repr__(self):
        return f"<dict nested {self.depth} deep>"


def nested(depth: int, container=list):
    value = []
    for _ in range(depth - 1):
        value = [value] if container is list else {"a": value}
    outer = Deep([value]) if container is list else DeepDict(a=value)
    outer.depth = depth
    return outer


HOSTILE = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 2**53, 2**64, -(2**63), 10**400, -0.0, 1e308]),
    st.just(10).map(lambda ten: ten**5000),  # no repr (> 4,300 digits): built, never listed
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.sampled_from(
        ["", "\x00", "a\x00b", "\ud800", "x" * 10_000, "\n", " ", "ObjectEvent\n", "ＯｂｊｅｃｔＥｖｅｎｔ"]
    ),
    st.sampled_from([[], {}, [None], {"id": None}, {"": ""}]).map(copy.deepcopy),  # later mutations change it
    st.builds(nested, st.sampled_from([50, 5_000]), st.sampled_from([list, dict])),
    st.integers(),
    st.floats(),
    st.text(max_size=40),
)
FIXED_KEY = base64.b64encode(bytes(range(32))).decode()
LOOK_ALIKES = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "-": "‐", "0": "０", "1": "ℓ", "T": "Τ"}
EXTRA_NAMES = ["extra", "chipledger:extra", "ilmd", "eventID", "sourceList", "readPoint", "type", "@context", "\x00"]


def paths(value, prefix=()):
    """Every path (tuple of keys and indices) in a JSON value, the root included; not into deep nesting."""
    yield prefix
    if isinstance(value, Deep | DeepDict) or len(prefix) > 12:
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*prefix, index))


def at(doc, path):
    for step in path:
        doc = doc[step]
    return doc


@st.composite
def mutated(draw, doc):
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(paths(doc))[1:]))
        parent, last = at(doc, path[:-1]), path[-1]
        value = parent[last]
        op = draw(st.sampled_from(["replace", "delete", "extra", "wrap", "text"]))
        if op == "replace":
            parent[last] = draw(HOSTILE)
        elif op == "delete":
            del parent[last]
        elif op == "extra" and isinstance(value, dict):
            value[draw(st.sampled_from(EXTRA_NAMES) | st.text(max_size=10))] = draw(HOSTILE)
        elif op == "wrap":
            parent[last] = draw(st.sampled_from([[value], {"id": value}, nested(3) + [value]]))
        elif op == "text" and isinstance(value, str):
            parent[last] = draw(look_alike(value))
        else:
            parent[last] = draw(HOSTILE)
    return doc


@st.composite
def look_alike(draw, text: str):
    how = draw(st.sampled_from(["suffix", "prefix", "swap", "nul", "case"]))
    if how == "suffix":
        return text + draw(st.sampled_from(["\n", "\r\n", "\x00", " ", "\u200b", "\u0301"]))
    if how == "prefix":
        return draw(st.sampled_from(["\ufeff", " ", "\n"])) + text
    if how == "swap":
        candidates = [i for i, ch in enumerate(text) if ch in LOOK_ALIKES]
        if candidates:
            i = draw(st.sampled_from(candidates))
            return text[:i] + LOOK_ALIKES[text[i]] + text[i + 1 :]
        return text + "ʼ"
    if how == "nul":
        i = draw(st.integers(0, len(text)))
        return text[:i] + "\x00" + text[i:]
    return text.swapcase()


def valid_documents(world, stock) -> dict[str, tuple[str, dict]]:
    """Name -> (the capturing client, a document that captures cleanly as it stands)."""
    fresh = [sgtin(s) for s in ("PROP-NEW-1", "PROP-NEW-2")]  # every example rolls back: the same serials do
    made = commissioning(fresh)
    made["ilmd"]["chipledger:publicKeys"] = dict.fromkeys(fresh, FIXED_KEY)  # the same data on every replay
    export = shipping([sgtin(s) for s in stock["made"]], "vendor-a", **{"chipledger:exportLicence": "TW-EL-1"})
    return {
        "commissioning": ("fab", document(made)),
        "export": ("fab", document(export)),
        "receipt": ("vendor_a", document(receiving([link(s) for s in stock["sent"]], "wh-vendor-a"))),
    }


@pytest.fixture
def world(db):
    world = epcis_world()
    sent = commissioned(world, 2)
    exported = shipping([sgtin(s) for s in sent], "vendor-a", **{"chipledger:exportLicence": "TW-EL-9"})
    assert world["fab"].post("/api/epcis/capture", document(exported)).status_code == 201
    return world, {"made": commissioned(world, 2), "sent": sent}


@contextmanager
def rolled_back():
    """Each example starts from the same world: its writes are undone when it ends."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def footprint() -> tuple[int, int, int]:
    return ledger_selectors.ledger_size(), Chip.objects.count(), ChipEvent.objects.count()


@pytest.mark.django_db
def test_the_unmutated_documents_capture(world):
    world, stock = world
    for name, (client, doc) in valid_documents(world, stock).items():
        with rolled_back():
            answer = services.epcis_capture(
                organisation=world[client].org, events=services.epcis_document_parse(doc), submission=None
            )
            assert answer["captured"] == 1, name


@pytest.mark.django_db
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_document_is_refused_cleanly_or_captured(world, data):
    world, stock = world
    documents = valid_documents(world, stock)
    name = data.draw(st.sampled_from(sorted(documents)), label="document")
    client, doc = documents[name]
    doc = data.draw(mutated(doc), label="mutated")
    with rolled_back():
        before = footprint()
        try:
            answer = services.epcis_capture(
                organisation=world[client].org, events=services.epcis_document_parse(doc), submission=None
            )
        except (ValidationError, ledger_services.Conflict) as refused:
            event(f"{name}: refused")
            if isinstance(refused, ValidationError):
                assert refused.message_dict, "a refusal names the path"
            assert footprint() == before, "a refused document wrote something"
            return
        event(f"{name}: captured")
        assert answer["captured"] + answer["duplicates"] == len(answer["eventList"]) >= 1
        assert footprint()[0] == before[0] + answer["captured"]


@settings(max_examples=1_000, deadline=None)
@given(
    doc=st.one_of(
        st.builds(
            lambda events: document(*events),
            st.lists(st.sampled_from([commissioning([sgtin("A1")]), receiving([link("B2")], "x")]), max_size=3),
        ).flatmap(mutated),
        st.dictionaries(st.sampled_from(["@context", "type", "schemaVersion", "creationDate", "epcisBody"]), HOSTILE),
    )
)
def test_the_parser_answers_any_document_with_events_or_a_validation_error(doc):
    try:
        events = services.epcis_document_parse(doc)
    except ValidationError as refused:
        assert refused.message_dict
        return
    assert all(isinstance(e, epcis_format.CaptureEvent) for e in events)


@pytest.mark.django_db
def test_a_non_ascii_public_key_is_a_400_through_the_api(world):
    """Found by the properties above: base64 of a non-ASCII string raised ValueError, a 500."""
    world, _ = world
    doc = document(commissioning([sgtin(s) for s in new_serials(1, prefix="PROP")]))
    keys = doc["epcisBody"]["eventList"][0]["ilmd"]["chipledger:publicKeys"]
    keys[next(iter(keys))] = "é" * 44
    response = world["fab"].post("/api/epcis/capture", doc)
    assert response.status_code == 400, response.content
    assert any("publicKeys" in path for path in response.json()), response.json()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "member, value",
    [
        ("chipledger:exportLicence", "\x00TW-EL-1"),
        ("chipledger:exportLicence", "TW-EL-1\n"),
        ("chipledger:exportLicence", "TW-EL-1\ud800"),
        ("reference", "PO\ud800"),
    ],
)
def test_control_characters_in_an_export_are_refused(world, member, value):
    """Found by the properties above on PostgreSQL: a NUL in the licence reached a text column (a DataError)."""
    world, stock = world
    extra = {"reference": value} if member == "reference" else {member: value}
    extra.setdefault("chipledger:exportLicence", "TW-EL-1")
    extra["eventID"] = "urn:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427"  # else hashing the event refuses a surrogate
    doc = document(shipping([sgtin(s) for s in stock["made"]], "vendor-a", **extra))
    before = footprint()
    with pytest.raises(ValidationError) as refused:
        services.epcis_capture(
            organisation=world["fab"].org, events=services.epcis_document_parse(doc), submission=None
        )
    assert "control characters" in str(refused.value)
    assert footprint() == before
