"""append_entries / append_entry: leaf bytes, chain, tree cache, validation, checkpoints."""

import base64
import json

import pytest
import rfc8785
from django.core.exceptions import ValidationError
from django.db import transaction

from ledger import selectors, services
from ledger.models import Checkpoint, Entry, TreeNode
from tests.factories import append_sample_entries
from tlog import merkle, note
from tlog.chain import LedgerFault

pytestmark = pytest.mark.django_db


def test_leaf_is_the_canonical_json_of_the_contract_fields():
    entry = services.append_entry("chip.shipped", {"serial": "SN-1", "to": "owner-a", "n": 3}, "vendor-a")
    leaf = bytes(entry.leaf)
    parsed = json.loads(leaf)
    assert parsed == {
        "v": 1,
        "seq": 0,
        "time": services.format_time(entry.time),
        "kind": "chip.shipped",
        "actor": "vendor-a",
        "payload": {"serial": "SN-1", "to": "owner-a", "n": 3},
        "prev": "0" * 64,
    }
    assert leaf == rfc8785.dumps(parsed)
    assert bytes(entry.hash) == merkle.leaf_hash(leaf)


def test_entries_form_a_hash_chain_with_contiguous_seq():
    rows = append_sample_entries(5) + append_sample_entries(3)
    stored = list(Entry.objects.order_by("seq"))
    assert [row.seq for row in stored] == list(range(8))
    for previous, current in zip(stored, stored[1:]):
        assert json.loads(bytes(current.leaf))["prev"] == bytes(previous.hash).hex()
    assert [bytes(r.leaf) for r in rows] == [bytes(r.leaf) for r in stored]


def test_submission_is_embedded_in_the_leaf():
    submission = {"key": "vendor-a/1", "body": base64.b64encode(b'{"x":1}').decode(), "sig": "c2ln"}
    entry = services.append_entry("chip.fabricated", {"serial": "SN-9"}, "fab-1", submission=submission)
    assert json.loads(bytes(entry.leaf))["submission"] == submission


@pytest.mark.parametrize("batches", [[1], [1, 1, 1], [7, 9], [16, 1, 15], [100, 28, 1, 3]])
def test_tree_cache_gives_the_same_root_as_a_fresh_recomputation(batches):
    for count in batches:
        append_sample_entries(count)
    hashes = [bytes(h) for h in Entry.objects.order_by("seq").values_list("hash", flat=True)]
    size = len(hashes)
    assert selectors.root_at(size) == merkle.root_from_leaf_hashes(hashes)
    # Exactly the complete subtrees of level >= 1 are cached: size - popcount(size) of them.
    assert TreeNode.objects.count() == size - bin(size).count("1")


def test_ten_thousand_entries_append_in_one_transaction():
    rows = append_sample_entries(10_000)
    assert len(rows) == 10_000 and selectors.ledger_size() == 10_000
    checkpoint = services.checkpoint_sign()
    assert bytes(checkpoint.root) == merkle.root_from_leaf_hashes([bytes(r.hash) for r in rows])


def test_a_failed_transaction_leaves_no_entry_behind():
    append_sample_entries(3)
    with pytest.raises(RuntimeError), transaction.atomic():
        append_sample_entries(5)
        raise RuntimeError("projection write failed")
    assert selectors.ledger_size() == 3
    assert TreeNode.objects.count() == 3 - bin(3).count("1")


@pytest.mark.parametrize(
    "kind, payload, actor, field",
    [
        ("Chip Shipped", {}, "vendor-a", "kind"),
        ("chip", {}, "vendor-a", "kind"),
        ("chip.shipped", {}, "", "actor"),
        ("chip.shipped", {}, "Vendor A", "actor"),
        ("chip.shipped", ["not", "an", "object"], "vendor-a", "payload"),
        ("chip.shipped", {"x": float("nan")}, "vendor-a", "payload"),
        ("chip.shipped", {"x": 2**60}, "vendor-a", "payload"),
    ],
)
def test_bad_entries_are_refused_naming_the_field_and_change_nothing(kind, payload, actor, field):
    append_sample_entries(2)
    with pytest.raises(ValidationError) as error:
        services.append_entries([services.NewEntry("test.ok", {}, "system"), services.NewEntry(kind, payload, actor)])
    assert any(key.endswith(field) for key in error.value.message_dict)
    assert selectors.ledger_size() == 2


def test_bad_submission_is_refused():
    with pytest.raises(ValidationError) as error:
        services.append_entry("chip.shipped", {}, "vendor-a", submission={"key": "k", "body": "b"})
    assert "entries[0].submission" in error.value.message_dict


def test_checkpoint_is_a_signed_note_over_the_current_tree():
    rows = append_sample_entries(13)
    checkpoint = services.checkpoint_sign()
    verifier = note.parse_verifier_key(selectors_key())
    body = note.verify_note(checkpoint.note, verifier)
    parsed = note.parse_checkpoint(body)
    assert (parsed.size, parsed.root) == (13, merkle.root_from_leaf_hashes([bytes(r.hash) for r in rows]))


def test_checkpoint_is_only_signed_again_when_the_log_grew():
    append_sample_entries(2)
    first = services.checkpoint_sign()
    assert services.checkpoint_if_grown() is None
    assert services.checkpoint_sign().pk == first.pk
    append_sample_entries(1)
    grown = services.checkpoint_if_grown()
    assert grown is not None and grown.size == 3
    assert Checkpoint.objects.count() == 2


def test_empty_log_checkpoint_has_the_empty_root():
    checkpoint = services.checkpoint_sign()
    assert checkpoint.size == 0 and bytes(checkpoint.root) == merkle.EMPTY_ROOT


def selectors_key() -> str:
    from ledger import keys

    return keys.verifier_key()


def _forge_checkpoint(size: int, root: bytes = b"\x07" * 32) -> None:
    """What a log looks like after it lost entries behind a signed checkpoint (a truncation, an old backup)."""
    Checkpoint.objects.create(size=size, root=root, note="forged for the test\n")


def test_a_log_smaller_than_its_checkpoint_refuses_appends_and_signing():
    append_sample_entries(5)
    _forge_checkpoint(9)
    with pytest.raises(LedgerFault, match="fewer than its signed checkpoint"):
        append_sample_entries(1)
    with pytest.raises(LedgerFault):
        services.checkpoint_sign()
    assert selectors.ledger_size() == 5 and Checkpoint.objects.order_by("-size").first().size == 9


def test_a_log_that_does_not_extend_its_checkpoint_refuses_appends():
    append_sample_entries(5)
    services.checkpoint_sign()
    append_sample_entries(2)  # the process has now seen the log extend size 5
    _forge_checkpoint(7)  # same size as the log, another root: a fork
    with pytest.raises(LedgerFault, match="do not match its signed checkpoint"):
        append_sample_entries(1)
    assert selectors.ledger_size() == 7
