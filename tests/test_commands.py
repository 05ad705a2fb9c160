"""Management commands used by `make run` and by regulators."""

import io

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from nacl.signing import SigningKey

from ledger import keys, selectors
from ledger.models import Checkpoint, Entry, Witness
from registry.models import Chip
from tlog import note

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_ledger_open_writes_the_genesis_once():
    assert run("ledger_open").startswith("opened: ")
    assert run("ledger_open").startswith("already open: ")
    genesis = Entry.objects.get(seq=0)
    assert genesis.kind == "ledger.opened" and genesis.actor == "system"
    assert genesis.payload == {"origin": settings.LEDGER_ORIGIN, "verifier_key": keys.verifier_key()}
    assert Checkpoint.objects.get().size == 1


def test_ledger_key_prints_the_verifier_key():
    assert run("ledger_key").strip() == keys.verifier_key()


def test_ledger_checkpoint_signs_and_prints_the_note():
    run("seed_demo", "--password", "demo-pass-123", "--chips", "50", "--no-chain")
    text = run("ledger_checkpoint")
    body = note.verify_note(text, note.parse_verifier_key(keys.verifier_key()))
    assert (
        note.parse_checkpoint(body).size == selectors.ledger_size() == Checkpoint.objects.order_by("-size").first().size
    )


def test_seed_demo_is_idempotent_and_prints_logins():
    first = run("seed_demo", "--password", "demo-pass-123", "--chips", "50", "--no-chain")
    second = run("seed_demo", "--password", "demo-pass-123", "--chips", "50", "--no-chain")
    assert "regulator" in first and "demo-pass-123" in first and first == second
    assert Chip.objects.count() == 50 and Chip.objects.filter(status="lost").count() == 1
    assert Entry.objects.filter(kind="ledger.opened").count() == 1
    assert get_user_model().objects.get(username="regulator").check_password("demo-pass-123")


def test_register_witness_command():
    vkey = note.verifier_key("w.example/1", bytes(SigningKey(bytes(32)).verify_key), note.COSIGNATURE_V1)
    assert "registered witness w.example/1" in run("register_witness", vkey)
    with pytest.raises(CommandError, match="already registered"):
        run("register_witness", vkey)
    assert "revoked" in run("register_witness", vkey, "--revoke")
    assert Witness.objects.get().revoked_seq is not None
    with pytest.raises(CommandError, match="verifier_key"):
        run("register_witness", "garbage")
