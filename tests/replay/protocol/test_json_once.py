"""replay.protocol.json_once: JSON as json.loads reads it, except an object that names a member twice."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.protocol.json_once import MemberTwice, loads

names = st.text(max_size=6)
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=12,
)


@given(documents)
def test_a_document_without_repeated_members_reads_as_json_reads_it(doc):
    text = json.dumps(doc)
    assert loads(text) == json.loads(text)


@given(st.dictionaries(names, st.integers(), min_size=1, max_size=5), st.data())
def test_any_object_naming_a_member_twice_is_refused_naming_it(obj, data):
    name = data.draw(st.sampled_from(sorted(obj)))
    members = [json.dumps(k) + ":" + json.dumps(v) for k, v in obj.items()]
    members.insert(data.draw(st.integers(0, len(members))), json.dumps(name) + ":0")
    depth = data.draw(st.integers(0, 3))  # at any depth: inside lists and other objects too
    text = "{" + ",".join(members) + "}"
    for _ in range(depth):
        text = '[{"x": ' + text + "}]"
    with pytest.raises(MemberTwice) as caught:
        loads(text)
    assert caught.value.name == name and isinstance(caught.value, ValueError)


def test_a_long_member_name_is_cut_in_the_message():
    name = "n" * 10_000 + "\\u0000"
    with pytest.raises(MemberTwice, match=r"'n{64}'") as caught:
        loads('{"' + name + '": 1, "' + name + '": 2}')
    assert len(str(caught.value)) < 120 and caught.value.name == "n" * 10_000 + "\x00"
