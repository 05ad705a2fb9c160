"""The public read API of docs/ledger.md (Endpoints), and its 400s."""

import base64
import time

import pytest
from django.conf import settings
from django.test import Client
from nacl.signing import SigningKey
from rest_framework.test import APIClient

from ledger import keys, services
from ledger.models import Checkpoint, Cosignature, Entry
from tests.factories import append_sample_entries
from tlog import merkle, note

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def log():
    rows = append_sample_entries(37)
    services.checkpoint_sign()
    return rows


def test_key_is_the_verifier_key(api):
    response = api.get("/api/ledger/key")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    assert response.content.decode().strip() == keys.verifier_key()
    parsed = note.parse_verifier_key(keys.verifier_key())
    assert parsed.name == settings.LEDGER_ORIGIN and parsed.public_key == bytes(keys.signing_key().verify_key)


def test_checkpoint_verifies_with_the_served_key(api, log):
    text = api.get("/api/ledger/checkpoint").content.decode()
    vkey = note.parse_verifier_key(api.get("/api/ledger/key").content.decode().strip())
    checkpoint = note.parse_checkpoint(note.verify_note(text, vkey))
    assert checkpoint.origin == settings.LEDGER_ORIGIN and checkpoint.size == 37
    assert checkpoint.root == merkle.root_from_leaf_hashes([bytes(r.hash) for r in log])


def test_checkpoint_of_an_empty_log_is_503_and_the_get_writes_nothing(api):
    response = api.get("/api/ledger/checkpoint")
    assert response.status_code == 503 and "ledger_open" in response.json()["detail"]
    assert Checkpoint.objects.count() == 0


def test_the_first_entry_is_signed_for_at_once(api):
    services.ledger_open()
    text = api.get("/api/ledger/checkpoint").content.decode()
    assert note.parse_checkpoint(note.split_note(text)[0]).size == 1
    assert services.ledger_open() is False and Entry.objects.get().kind == "ledger.opened"


def test_entries_serve_the_exact_leaf_bytes(api, log):
    body = api.get("/api/ledger/entries?start=3&end=9").json()
    assert [e["seq"] for e in body["entries"]] == list(range(3, 9))
    for served, row in zip(body["entries"], log[3:9]):
        assert base64.b64decode(served["leaf"]) == bytes(row.leaf)
        assert served["hash"] == merkle.leaf_hash(bytes(row.leaf)).hex()
        assert (served["kind"], served["actor"]) == (row.kind, row.actor)


def test_entries_default_page_runs_to_the_end(api, log):
    assert len(api.get("/api/ledger/entries?start=30").json()["entries"]) == 7
    assert api.get("/api/ledger/entries?start=37").json() == {"entries": []}


def test_every_inclusion_proof_verifies_at_every_size(api, log):
    hashes = [bytes(r.hash) for r in log]
    for size in range(1, len(log) + 1):
        root = merkle.root_from_leaf_hashes(hashes[:size])
        for index in range(size):
            body = api.get(f"/api/ledger/proof/inclusion?index={index}&size={size}").json()
            proof = [base64.b64decode(h) for h in body["hashes"]]
            assert (body["index"], body["size"]) == (index, size)
            assert merkle.verify_inclusion(hashes[index], index, size, proof, root), (index, size)


def test_every_consistency_proof_verifies(api, log):
    hashes = [bytes(r.hash) for r in log]
    for second in range(0, len(log) + 1, 3):
        for first in range(0, second + 1):
            body = api.get(f"/api/ledger/proof/consistency?first={first}&second={second}").json()
            proof = [base64.b64decode(h) for h in body["hashes"]]
            assert merkle.verify_consistency(
                first,
                second,
                proof,
                merkle.root_from_leaf_hashes(hashes[:first]),
                merkle.root_from_leaf_hashes(hashes[:second]),
            ), (first, second)


@pytest.mark.parametrize(
    "url, field",
    [
        ("/api/ledger/proof/inclusion?index=37&size=37", "index"),
        ("/api/ledger/proof/inclusion?index=0&size=38", "size"),
        ("/api/ledger/proof/inclusion?index=0&size=0", "size"),
        ("/api/ledger/proof/inclusion?index=x&size=3", "index"),
        ("/api/ledger/proof/inclusion?index=-1&size=3", "index"),
        ("/api/ledger/proof/inclusion?size=3", "index"),
        ("/api/ledger/proof/inclusion?index=1.5&size=3", "index"),
        ("/api/ledger/proof/inclusion?index=0&size=99999999999999999999999", "size"),
        ("/api/ledger/proof/consistency?first=5&second=4", "first"),
        ("/api/ledger/proof/consistency?first=1&second=38", "second"),
        ("/api/ledger/proof/consistency?first=a&second=4", "first"),
        ("/api/ledger/entries?start=0&end=38", "end"),
        ("/api/ledger/entries?start=0&end=5000", "end"),
        ("/api/ledger/entries?start=9&end=3", "start"),
        ("/api/ledger/entries?start=zero", "start"),
    ],
)
def test_bad_parameters_get_a_400_naming_the_field(api, log, url, field):
    response = api.get(url)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_huge_page_is_refused_even_on_a_big_log(api, log, settings):
    settings.LEDGER_MAX_PAGE = 10
    assert api.get("/api/ledger/entries?start=0&end=11").status_code == 400
    assert len(api.get("/api/ledger/entries?start=0").json()["entries"]) == 10


def test_schema_documents_the_ledger_endpoints(api):
    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/api/ledger/checkpoint", "/api/ledger/proof/inclusion", "/api/ledger/cosignatures"):
        assert path in paths


# --- witnesses and cosignatures -------------------------------------------------

WITNESS_NAME = "witness.example.org/w1"


@pytest.fixture
def witness_key():
    return SigningKey(bytes(range(32)))


def witness_vkey(key: SigningKey, name: str = WITNESS_NAME) -> str:
    return note.verifier_key(name, bytes(key.verify_key), note.COSIGNATURE_V1)


def cosign_latest(api, key: SigningKey, name: str = WITNESS_NAME) -> tuple[str, str]:
    text = api.get("/api/ledger/checkpoint").content.decode()
    body, _ = note.split_note(text)
    return text, note.cosign(body, name, key, int(time.time())).strip("\n")


def test_registered_witness_cosignature_is_served_with_the_checkpoint(api, log, witness_key):
    services.witness_register(witness_vkey(witness_key), actor="regulator")
    text, line = cosign_latest(api, witness_key)
    response = api.post("/api/ledger/cosignatures", {"checkpoint": text, "cosignature": line}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["size"] == 37 and response.json()["witness"] == WITNESS_NAME
    served = api.get("/api/ledger/checkpoint").content.decode()
    body, signatures = note.split_note(served)
    witness = note.parse_verifier_key(witness_vkey(witness_key))
    cosigs = [s for s in signatures if s.key_id == witness.key_id]
    assert len(cosigs) == 1 and note.verify_cosignature(body, cosigs[0], witness) > 0
    # Resubmitting is idempotent.
    assert (
        api.post("/api/ledger/cosignatures", {"checkpoint": text, "cosignature": line}, format="json").status_code
        == 201
    )
    assert Cosignature.objects.count() == 1


def test_witness_registration_is_a_ledger_entry(log, witness_key):
    witness = services.witness_register(witness_vkey(witness_key), actor="regulator")
    from ledger.models import Entry

    entry = Entry.objects.get(seq=witness.registered_seq)
    assert entry.kind == "ledger.witness_registered" and entry.payload["verifier_key"] == witness_vkey(witness_key)


def test_unregistered_witness_is_refused(api, log, witness_key):
    text, line = cosign_latest(api, witness_key)
    response = api.post("/api/ledger/cosignatures", {"checkpoint": text, "cosignature": line}, format="json")
    assert response.status_code == 400 and "cosignature" in response.json()
    assert Cosignature.objects.count() == 0


def test_revoked_witness_is_refused(api, log, witness_key):
    services.witness_register(witness_vkey(witness_key), actor="regulator")
    services.witness_revoke(witness_vkey(witness_key), actor="regulator")
    text, line = cosign_latest(api, witness_key)
    assert (
        api.post("/api/ledger/cosignatures", {"checkpoint": text, "cosignature": line}, format="json").status_code
        == 400
    )


def test_forged_cosignature_is_refused(api, log, witness_key):
    services.witness_register(witness_vkey(witness_key), actor="regulator")
    impostor = SigningKey(bytes(32))
    text, _ = cosign_latest(api, witness_key)
    body, _ = note.split_note(text)
    forged = note.cosign(body, WITNESS_NAME, impostor, int(time.time()))
    # Same name, impostor key id: unknown witness; real key id with impostor's signature: bad signature.
    real_id = note.parse_verifier_key(witness_vkey(witness_key)).key_id
    _, [sig] = note.split_note(body + "\n" + forged)
    relabelled = note.signature_line(WITNESS_NAME, real_id, sig.signature).strip("\n")
    for line in (forged.strip("\n"), relabelled):
        response = api.post("/api/ledger/cosignatures", {"checkpoint": text, "cosignature": line}, format="json")
        assert response.status_code == 400 and "cosignature" in response.json()


def test_cosignature_over_a_different_tree_of_the_same_size_is_a_conflict(api, log, witness_key):
    services.witness_register(witness_vkey(witness_key), actor="regulator")
    body = note.checkpoint_body(settings.LEDGER_ORIGIN, 37, bytes(32))
    fork = note.sign_note(body, settings.LEDGER_ORIGIN, keys.signing_key())
    line = note.cosign(body, WITNESS_NAME, witness_key, int(time.time())).strip("\n")
    response = api.post("/api/ledger/cosignatures", {"checkpoint": fork, "cosignature": line}, format="json")
    assert response.status_code == 409


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"cosignature": "x"}, "checkpoint"),
        ({"checkpoint": "not a note", "cosignature": "x"}, "checkpoint"),
        ({"checkpoint": "other.origin\n37\n" + "A" * 43 + "=\n\n— x AAAA\n", "cosignature": "x"}, "checkpoint"),
    ],
)
def test_malformed_cosignature_requests(api, log, payload, field):
    response = api.post("/api/ledger/cosignatures", payload, format="json")
    assert response.status_code == 400 and field in response.json()


def test_witness_key_of_the_wrong_type_is_refused(witness_key):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError):
        services.witness_register(note.verifier_key(WITNESS_NAME, bytes(witness_key.verify_key)), actor="regulator")


def test_swagger_ui_is_served_without_a_cdn(api):
    html = api.get("/api/docs/").content.decode()
    assert "drf_spectacular_sidecar" in html and "cdn.jsdelivr" not in html


def test_batched_inclusion_proofs_equal_single_ones(log):
    from ledger import selectors

    indices = [0, 5, 17, 31, 36]
    batched = selectors.inclusion_proofs(indices, 37)
    assert batched == {index: selectors.inclusion_proof(index, 37) for index in indices}


def test_a_write_to_a_log_behind_its_checkpoint_is_503_not_500(api, log, witness_key, django_user_model):
    """The API (exception handler) and the admin (middleware) both answer 503, and nothing is appended."""
    Checkpoint.objects.create(size=10_000, root=b"\x07" * 32, note="forged\n")
    size = Entry.objects.count()
    client = Client(raise_request_exception=False)
    client.force_login(django_user_model.objects.create_superuser("root-503", "r@example.org", "pw-503-long"))
    response = client.post("/admin/ledger/witness/add/", {"verifier_key": witness_vkey(witness_key, "w.example/503")})
    assert response.status_code == 503 and "refuses writes" in response.json()["detail"]
    assert Entry.objects.count() == size
