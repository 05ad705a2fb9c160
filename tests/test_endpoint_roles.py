"""Every endpoint × every role: the expected status, and no response leaks another organisation's chips, tasks,
claims or logs, error messages included. Endpoints come from the URL conf: a new one without a row fails here."""

import pytest
from django.urls import get_resolver
from nacl.signing import SigningKey
from rest_framework.test import APIClient

from inspections.models import InspectionTask
from inspections.services import inspectors
from ledger import services as ledger_services
from registry import services
from tests.inspections.conftest import inspections_draw
from tests.inspections.factories import accepted
from tests.registry.factories import SignedClient, organisation
from tests.shared_world import seeded_once_per_module

pytestmark = pytest.mark.django_db
ROLES = ["anonymous", "fab", "vendor", "owner_a", "owner_b", "inspect_us", "inspect_eu", "auditor", "regulator"]
DJANGO_OWN = ("admin/", "accounts/")  # Django's admin and auth views, covered by their own tests


def endpoints() -> set[str]:
    def walk(resolver, prefix=""):
        for pattern in resolver.url_patterns:
            if hasattr(pattern, "url_patterns"):
                yield from walk(pattern, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern)

    return {url for url in walk(get_resolver()) if not url.startswith(DJANGO_OWN)}


def row(default, **by_role):
    return {role: by_role.get(role, default) for role in ROLES}


API = dict(anonymous=401)  # every API endpoint below needs a token
SIGNED_403 = row(403, anonymous=401)  # unsigned or signed by a key not the caller's: refused before anything
PUBLIC = row(200)
BODIES_ONLY = row(403, anonymous=401, inspect_us=200, inspect_eu=200)
# (method, URL pattern, path, body, expected status per role)
TABLE = [
    ("get", "portal/", "/portal/", None, row(403, anonymous=302, inspect_us=200, inspect_eu=200)),
    (
        "get",
        "portal/tasks/<int:task_id>/",
        "/portal/tasks/{task}/",
        None,
        row(403, anonymous=302, inspect_us=200, inspect_eu=404),
    ),
    ("get", "healthz", "/healthz", None, PUBLIC),
    ("get", "api/ledger/key", "/api/ledger/key", None, PUBLIC),
    ("get", "api/ledger/checkpoint", "/api/ledger/checkpoint", None, PUBLIC),
    ("get", "api/ledger/entries", "/api/ledger/entries?start=0&end=2", None, PUBLIC),
    ("get", "tlog/checkpoint", "/tlog/checkpoint", None, PUBLIC),
    ("get", "tlog/^tile/(?P<path>.+)\\Z", "/tlog/tile/entries/000.p/1", None, PUBLIC),
    ("get", "api/ledger/proof/inclusion", "/api/ledger/proof/inclusion?index=0&size=1", None, PUBLIC),
    ("get", "api/ledger/proof/consistency", "/api/ledger/proof/consistency?first=1&second=1", None, PUBLIC),
    ("post", "api/ledger/cosignatures", "/api/ledger/cosignatures", {"checkpoint": "x"}, row(400)),
    ("get", "api/registry/organisations", "/api/registry/organisations", None, row(200, **API)),
    ("get", "api/registry/chip-models", "/api/registry/chip-models", None, row(200, **API)),
    ("post", "api/registry/keys", "/api/registry/keys", {"public_key": "AA=="}, row(400, anonymous=401, auditor=403)),
    (
        "post",
        "api/registry/keys/revoke",
        "/api/registry/keys/revoke",
        {"key_id": "0" * 16},
        row(400, anonymous=401, auditor=403),
    ),
    (
        "post",
        "api/registry/facilities",
        "/api/registry/facilities",
        {"slug": "x"},
        row(400, anonymous=401, auditor=403),
    ),
    ("get", "api/registry/chips", "/api/registry/chips", None, row(200, **API)),
    # installing an installed chip fails for everyone: its owner (and the regulator) learn why, others "unknown chip"
    (
        "post",
        "api/registry/chips/events/<slug:event>",
        "/api/registry/chips/events/install",
        {"chips": ["{chip}"], "facility": "dc-owner-a"},
        row(400, anonymous=401, auditor=403),
    ),
    (
        "get",
        "api/registry/chips/<str:serial>",
        "/api/registry/chips/{chip}",
        None,
        row(404, anonymous=401, fab=200, owner_a=200, inspect_us=200, inspect_eu=200, auditor=200, regulator=200),
    ),
    ("get", "api/inspections/tasks", "/api/inspections/tasks", None, BODIES_ONLY),
    (
        "post",
        "api/inspections/tasks/<int:task_id>/challenge",
        "/api/inspections/tasks/{task}/challenge",
        {},
        row(403, anonymous=401, inspect_us=201, inspect_eu=404),
    ),
    (
        "post",
        "api/inspections/tasks/<int:task_id>/identity",
        "/api/inspections/tasks/{task}/identity",
        {},
        row(403, anonymous=401, inspect_us=400, inspect_eu=404),
    ),
    (
        "post",
        "api/inspections/tasks/<int:task_id>/snapshot-log",
        "/api/inspections/tasks/{task}/snapshot-log",
        {},
        row(403, anonymous=401, inspect_us=400, inspect_eu=404),
    ),
    (
        "post",
        "api/inspections/tasks/<int:task_id>/finding",
        "/api/inspections/tasks/{task}/finding",
        {},
        row(403, anonymous=401, inspect_us=400, inspect_eu=404),
    ),
    (
        "post",
        "api/inspections/tasks/<int:task_id>/accept",
        "/api/inspections/tasks/{task}/accept",
        {},
        row(403, anonymous=401, inspect_us=400, inspect_eu=404),  # the world's task is accepted (its log): once
    ),
    ("post", "api/inspections/claims", "/api/inspections/claims", {"claims": []}, row(400, anonymous=401, auditor=403)),
    (
        "get",
        "api/inspections/claims/<int:claim_id>",
        "/api/inspections/claims/{claim}",
        None,
        # an inspection body reads only the claims answering its own tasks' snapshots
        row(404, anonymous=401, owner_a=200, inspect_us=200, inspect_eu=404, auditor=200, regulator=200),
    ),
    (
        "get",
        "api/inspections/snapshot-logs/<int:log_id>",
        "/api/inspections/snapshot-logs/{log}",
        None,
        row(403, anonymous=401, inspect_us=200, inspect_eu=404),
    ),
    (
        "post",
        "api/epcis/capture",
        "/api/epcis/capture",
        {"type": "EPCISDocument"},
        row(400, anonymous=401, auditor=403),
    ),
    (
        "get",
        "api/epcis/events",
        "/api/epcis/events?epc={chip}",
        None,
        row(404, anonymous=401, fab=200, owner_a=200, inspect_us=200, inspect_eu=200, auditor=200, regulator=200),
    ),
    ("get", "api/schema/", "/api/schema/", None, PUBLIC),
    ("get", "api/docs/", "/api/docs/", None, PUBLIC),
    ("get", "", "/", None, PUBLIC),  # the landing page: what the system is and where each user goes
]
# The state of owner A's chip: the regulator, the auditor and inspection bodies see every chip (GET as POST).
SECRET_WORDS = ("installed", "in_stock", "dc-owner-a")


def test_every_endpoint_has_a_row():
    assert {pattern for _, pattern, *_ in TABLE} == endpoints()


def endpoint_roles_world() -> dict:
    """The drawn inspections world, plus a vendor, a regulator with an auditor, and one claim and one log."""
    ledger_services.ledger_open()
    inspections_draw()
    from registry.models import Organisation

    clients = {"anonymous": None}
    for role, slug in (
        ("fab", "fab-tw"),
        ("owner_a", "owner-a"),
        ("owner_b", "owner-b"),
        ("inspect_us", "inspect-us"),
        ("inspect_eu", "inspect-eu"),
    ):
        org, key = Organisation.objects.get(slug=slug), SigningKey.generate()
        services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
        clients[role] = SignedClient(org, key)
    vendor, vendor_key = organisation("vendor-x", ["vendor"], "US")
    regulator, regulator_key = organisation("regulator", ["regulator"], "US")
    clients["vendor"] = SignedClient(vendor, vendor_key)
    clients["regulator"] = SignedClient(regulator, regulator_key)
    clients["auditor"] = SignedClient(regulator, SigningKey.generate())  # an auditor holds no signing key
    task = InspectionTask.objects.filter(inspection_body__slug="inspect-us").select_related("chip").first()
    log = inspectors.snapshot_log_upload(accepted(task), task.inspection_body, "{}\n")
    claim = _a_claim(task, log)
    ledger_services.checkpoint_sign()
    return {"clients": clients, "chip": task.chip.serial, "task": task.pk, "log": log.pk, "claim": claim}


endpoint_roles_world_fixture = seeded_once_per_module(endpoint_roles_world)


@pytest.fixture
def world(endpoint_roles_world):
    """One world for the roles' tests (seeded once per module; a test's requests are rolled back after it)."""
    return endpoint_roles_world


def _a_claim(task, log) -> int:
    from inspections.models import Claim, Snapshot

    snapshot = Snapshot.objects.create(
        chip=task.chip,
        log=log,
        counter=0,
        time="2026-01-01T00:00:00Z",
        shard=0,
        hash="ab" * 32,
        claim_due_on="2099-01-01",
    )
    claim = Claim.objects.create(
        prover=task.prover,
        snapshot=snapshot,
        run="r",
        step=1,
        manifest="cd" * 32,
        location="/secret/transcripts/run-1",
        claimed_seq=0,
    )
    return claim.pk


def _call(client, method, path, body, web):
    if client is None:
        anonymous = web if path.startswith("/portal") else APIClient()
        return getattr(anonymous, method)(path, body, format="json") if method == "post" else anonymous.get(path)
    if path.startswith("/portal"):
        web.force_login(client.user)
        return web.get(path)
    if method == "post":
        return client.post(path, body)
    return client.api.get(path)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_gets_the_expected_status_and_sees_nothing_of_others(world, role, client):
    client_for_role = world["clients"][role]
    got = {}
    for method, pattern, path, body, expected in TABLE:
        filled = path.format(**{k: world[k] for k in ("chip", "task", "log", "claim")})
        if body is not None:
            body = {k: [x.format(chip=world["chip"]) for x in v] if isinstance(v, list) else v for k, v in body.items()}
        response = _call(client_for_role, method, filled, body, client)
        got[pattern] = response.status_code
        text = response.content.decode(errors="replace")
        if expected[role] in (403, 404) or (role in ("owner_b", "vendor") and "chips/events" in pattern):
            for secret in (*SECRET_WORDS, "/secret/transcripts"):
                assert secret not in text, f"{role} {method} {filled}: {secret!r} in {text[:300]}"
        if role in ("owner_b", "vendor") and pattern in ("api/registry/chips", "api/inspections/tasks"):
            assert world["chip"] not in text
        if role == "inspect_eu" and pattern == "api/inspections/tasks":
            assert f'"id":{world["task"]},' not in text.replace(" ", "")
    assert got == {pattern: expected[role] for _, pattern, _, _, expected in TABLE}
