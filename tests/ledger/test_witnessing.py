"""The log's side of C2SP tlog-witness: each new checkpoint goes to every registered witness with
add-checkpoint, the cosignatures come back onto the served checkpoint under the M-of-N policy, and a 409
teaches the log the witness's size. The witness is the real server (tlog/witness_server.py) in a thread."""

from __future__ import annotations

import threading

import nacl.signing
import pytest

from ledger import keys, selectors, services
from ledger.models import Cosignature
from tests.factories import append_sample_entries
from tests.ledger import independent_client
from tlog import note, witness_server
from tlog.log_witness import witness_verifier_key

NAME = "witness.example/w1"
KEY = nacl.signing.SigningKey(b"\x0b" * 32)
VKEY = witness_verifier_key(NAME, KEY)


@pytest.fixture
def witness(tmp_path, settings):
    served = witness_server.Witness(NAME, KEY, [keys.verifier_key()], witness_server.Store(str(tmp_path / "w.db")))
    server = witness_server.make_server(served, "127.0.0.1", 0, "/w/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.LEDGER_WITNESS_URLS = {NAME: f"http://127.0.0.1:{server.server_address[1]}/w/"}
    services.witness_register(VKEY, actor="regulator")
    yield served
    server.shutdown()
    server.server_close()


def _statuses():
    return [(answer.witness, answer.status) for answer in services.witnesses_cosign_latest()]


@pytest.mark.django_db
def test_each_new_checkpoint_is_cosigned_and_served_with_the_cosignature(witness, client):
    append_sample_entries(5)
    first = services.checkpoint_sign()
    assert _statuses() == [(NAME, 200)]
    assert _statuses() == []  # nothing left to ask: it cosigned the latest
    served = client.get("/tlog/checkpoint").content.decode()
    body = note.split_note(first.note)[0]
    assert note.verify_note(served, note.parse_verifier_key(VKEY)) == body
    append_sample_entries(20)
    second = services.checkpoint_sign()
    assert _statuses() == [(NAME, 200)]  # old 6, with our consistency proof to 26
    assert witness.store.latest(keys.verifier_key().split("+")[0]) == (second.size, bytes(second.root))
    assert Cosignature.objects.filter(witness__name=NAME).count() == 2


@pytest.mark.django_db
def test_a_409_gives_the_witness_size_and_the_log_asks_again_from_there(witness):
    append_sample_entries(5)
    first = services.checkpoint_sign()
    # The witness cosigned it for someone else (or we lost its answer): it holds size 6, we think 0.
    assert witness.add_checkpoint(f"old 0\n\n{first.note}".encode()).status == 200
    append_sample_entries(3)
    services.checkpoint_sign()
    assert _statuses() == [(NAME, 200)]


@pytest.mark.django_db
def test_a_witness_that_is_down_or_unconfigured_is_reported_and_asked_again(witness, settings):
    append_sample_entries(2)
    services.checkpoint_sign()
    settings.LEDGER_WITNESS_URLS = {NAME: "http://127.0.0.1:9/"}
    assert _statuses() == [(NAME, None)]
    settings.LEDGER_WITNESS_URLS = {}
    assert services.witnesses_cosign_latest()[0].detail.startswith("no URL configured")
    assert Cosignature.objects.count() == 0


@pytest.mark.django_db
def test_the_served_checkpoint_follows_the_m_of_n_policy(witness, settings, client):
    settings.LEDGER_WITNESS_QUORUM = 1
    append_sample_entries(4)
    cosigned = services.checkpoint_sign()
    _statuses()
    append_sample_entries(4)
    newest = services.checkpoint_sign()  # not cosigned yet
    assert client.get("/tlog/checkpoint").content.decode() == selectors.checkpoint_text(cosigned)
    assert client.get("/api/ledger/checkpoint").content.decode() == selectors.checkpoint_text(newest)  # witnesses
    _statuses()
    assert client.get("/tlog/checkpoint").content.decode() == selectors.checkpoint_text(newest)
    assert newest.size == cosigned.size + 4


@pytest.mark.django_db(transaction=True)
def test_an_independent_client_verifies_the_cosigned_checkpoint_under_a_witness_policy(witness, live_server):
    append_sample_entries(300)
    services.checkpoint_sign()
    _statuses()
    url, log_key = live_server.url + "/tlog/", keys.verifier_key()
    status, report = independent_client.run(url, log_key, "--witness", VKEY, "--quorum", "1")
    assert status == 0 and report["cosignatures"] == 1, report
    other = witness_verifier_key("other.example/w", nacl.signing.SigningKey(b"\x0c" * 32))
    status, report = independent_client.run(url, log_key, "--witness", VKEY, "--witness", other, "--quorum", "2")
    assert status == 1 and not report["checkpoint_ok"], report


@pytest.mark.django_db
def test_the_beat_asks_the_witnesses(witness, settings):
    from ledger import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["ledger-witnesses"]
    assert entry["task"] == tasks.witnesses_cosign_latest.name and entry["schedule"].total_seconds() > 0
    append_sample_entries(2)
    services.checkpoint_sign()
    assert tasks.witnesses_cosign_latest() == {NAME: 200}
    assert tasks.witnesses_cosign_latest() == {}


@pytest.mark.django_db(transaction=True)
def test_under_a_quorum_a_pull_mode_witness_still_sees_and_cosigns_the_newest_checkpoint(
    live_server, tmp_path, settings
):
    from tlog import log_witness
    from tlog.logclient import LogClient

    settings.LEDGER_WITNESS_QUORUM = 1
    key_path = str(tmp_path / "pull.key")
    name, key, _ = log_witness.load_or_create_key(key_path, "pull.example/w")
    services.witness_register(log_witness.witness_verifier_key(name, key), actor="regulator")
    append_sample_entries(3)
    newest = services.checkpoint_sign()
    client = LogClient(live_server.url)
    assert client.checkpoint() == selectors.checkpoint_text(newest)  # nothing cosigned yet: the newest
    append_sample_entries(2)
    newer = services.checkpoint_sign()
    assert note.parse_checkpoint(note.split_note(client.checkpoint())[0]).size == newer.size
    outcome = log_witness.run_once(client, name, key, str(tmp_path / "state.json"), log_key=keys.verifier_key())
    assert outcome.status == 201 and outcome.state.size == newer.size
    append_sample_entries(2)
    services.checkpoint_sign()  # newer than the cosigned one: the published checkpoint stays the cosigned one
    assert client.checkpoint() == selectors.checkpoint_text(newer)
    outcome = log_witness.run_once(client, name, key, str(tmp_path / "state.json"), log_key=keys.verifier_key())
    assert outcome.status == 201 and outcome.state.size == newer.size + 2
