"""The signed-write protocol as a service, without HTTP: what it keeps for a retry, and what it never keeps."""

import json
import secrets
import time

import pytest
from django.core.exceptions import ValidationError
from django.http import Http404

from api.signed_writes import IDEMPOTENCY_HEADER, Answer, signed_write_handle
from ledger import services as ledger_services
from registry import signing
from registry.models import ApiNonce
from tests.registry.factories import organisation

pytestmark = pytest.mark.django_db


@pytest.fixture
def vendor():
    return organisation(f"vendor-{secrets.token_hex(3)}", ["vendor"])


def _signed(key, idempotency_key: str | None = None, **fields) -> tuple[bytes, dict]:
    body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(12), **fields}).encode()
    headers = {signing.HEADER: signing.sign(key, body)}
    if idempotency_key:
        headers[IDEMPOTENCY_HEADER] = idempotency_key
    return body, headers


def test_an_accepted_write_runs_once_and_a_retry_gets_its_answer(vendor):
    org, key = vendor
    calls = []

    def perform(data, submission):
        calls.append((data["n"], submission["key"]))
        return {"n": data["n"]}

    body, headers = _signed(key, "k-1", n=7)
    assert signed_write_handle(org, body, headers, perform) == Answer(201, {"n": 7})
    assert signed_write_handle(org, body, headers, perform, success_status=200) == Answer(201, {"n": 7})
    assert len(calls) == 1 and calls[0][0] == 7


@pytest.mark.parametrize(
    "refusal, expected",
    [
        (ValidationError({"chips": "too many"}), Answer(400, {"chips": ["too many"]})),
        (ValidationError("no field"), Answer(400, {"non_field_errors": ["no field"]})),
        (ledger_services.Conflict("taken"), Answer(409, {"detail": "taken"})),
    ],
)
def test_a_refusal_is_answered_and_kept_for_the_retry(vendor, refusal, expected):
    org, key = vendor
    calls = []

    def perform(data, submission):
        calls.append(1)
        raise refusal

    body, headers = _signed(key, "k-2")
    assert signed_write_handle(org, body, headers, perform) == expected
    assert signed_write_handle(org, body, headers, perform) == expected
    assert len(calls) == 1


def test_anything_else_raised_is_not_kept_and_the_nonce_stays_spent(vendor):
    org, key = vendor

    def perform(data, submission):
        raise Http404("no such task")

    body, headers = _signed(key, "k-3")
    with pytest.raises(Http404):
        signed_write_handle(org, body, headers, perform)
    assert ApiNonce.objects.filter(nonce=json.loads(body)["nonce"]).exists()
    with pytest.raises(ledger_services.Conflict):  # the key has no answer: "in progress", never a 403
        signed_write_handle(org, body, headers, perform)


@pytest.mark.parametrize(
    "body, field",
    [(b"[1, 2]", "body"), (b'{"a": NaN}', "a"), (b'{"timestamp": 1, "x": "\\u0000"}', "x"), (b"{", "body")],
)
def test_a_body_that_is_not_a_strict_json_object_is_refused_before_the_signature(vendor, body, field):
    org, key = vendor
    headers = {signing.HEADER: signing.sign(key, body)}
    with pytest.raises(ValidationError) as refused:
        signed_write_handle(org, body, headers, lambda data, submission: {})
    assert field in refused.value.message_dict
    assert not ApiNonce.objects.exists()


def test_a_bad_signature_runs_nothing_and_spends_no_nonce(vendor):
    org, key = vendor
    body, headers = _signed(key)
    headers[signing.HEADER] = signing.sign(organisation("other-vendor", ["vendor"])[1], body)
    with pytest.raises(signing.SignatureProblem):
        signed_write_handle(org, body, headers, lambda data, submission: pytest.fail("performed"))
    assert not ApiNonce.objects.exists()
