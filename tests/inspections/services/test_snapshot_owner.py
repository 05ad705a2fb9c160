"""Who answers a logged snapshot: the chip's owner at the snapshot's signed time (the registry as it was then),
not today's owner: a chip sold after it trained is still the seller's for that training, never the buyer's."""

import base64
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from nacl.signing import SigningKey

from inspections.models import Alert, Claim, Snapshot
from inspections.services import sweeps
from inspections.tasks import check_snapshot_log
from ledger.models import Entry
from registry import services
from registry.models import Organisation
from tests.inspections.services.test_inspectors import a_task, firmware_log, inspector, upload, with_chip_key
from tests.registry.factories import SignedClient

pytestmark = pytest.mark.django_db


def client_for(slug: str) -> SignedClient:
    organisation, key = Organisation.objects.get(slug=slug), SigningKey.generate()
    services.organisation_key_register(organisation=organisation, public_key=bytes(key.verify_key), actor="regulator")
    return SignedClient(organisation, key)


def signed_log(key: SigningKey, serial: str, times: list[datetime]) -> list[str]:
    """A firmware log whose snapshots the chip signed at these times."""
    from replay.protocol.firmware import canonical, record_hash

    lines, prev = [], "0" * 64
    for counter, when in enumerate(times):
        record = {
            "serial": serial,
            "counter": counter,
            "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "shard": 0,
            "hash": f"{counter:064x}",
            "prev": prev,
        }
        record["sig"] = base64.b64encode(key.sign(canonical(record)).signature).decode()
        lines.append(canonical(record).decode())
        prev = record_hash(record)
    return lines


def sell(task) -> tuple[SignedClient, SignedClient]:
    seller = task.chip.owner.slug
    buyer = "owner-a" if seller != "owner-a" else "owner-b"
    seller_client, buyer_client = client_for(seller), client_for(buyer)
    offer = {"chips": [task.chip.serial], "to_owner": buyer}
    assert seller_client.post("/api/registry/chips/events/transfer-offer", offer).status_code == 201
    assert (
        buyer_client.post("/api/registry/chips/events/transfer-accept", {"chips": [task.chip.serial]}).status_code
        == 201
    )
    return seller_client, buyer_client


def answer(client, serial: str, counter: int = 0):
    item = {"serial": serial, "counter": counter, "run": "r", "step": 0, "manifest": "ab" * 32, "location": "/t"}
    return client.post("/api/inspections/claims", {"claims": [item]})


def read_log(client, task, lines, capture) -> None:
    with capture(execute=False):
        response = upload(client, task, lines)
    assert check_snapshot_log(response.json()["id"]) == "intact"


def test_the_seller_answers_snapshots_read_before_the_sale_and_the_buyer_cannot(
    draw, django_capture_on_commit_callbacks
):
    eu, task = inspector("inspect-eu"), a_task("inspect-eu")
    key = with_chip_key(task)
    eu.post(f"/api/inspections/tasks/{task.pk}/accept")
    read_log(eu, task, firmware_log(key, task.chip.serial, 2), django_capture_on_commit_callbacks)
    seller, buyer = sell(task)
    size = Entry.objects.count()
    with django_capture_on_commit_callbacks(execute=False):
        refused = answer(buyer, task.chip.serial)
        assert refused.status_code == 400 and "claims[0]" in refused.json(), refused.content
        assert Entry.objects.count() == size and not Claim.objects.exists()
        assert answer(seller, task.chip.serial).status_code == 201
    assert Claim.objects.get().prover.slug == seller.org.slug


class LedgerClock:
    """The clock the ledger stamps entries with, moved by the test in whole seconds (no waiting on the real one):
    it starts at the next whole second after now, so every earlier entry is strictly before it."""

    def __init__(self):
        self.now = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)

    def __call__(self) -> datetime:
        return self.now

    def tick(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


def test_snapshots_signed_before_a_sale_and_read_after_it_are_the_sellers(
    draw, django_capture_on_commit_callbacks, monkeypatch
):
    """The inspector reads the chip at the buyer's: the snapshots the chip signed before the sale (by its own
    clock, between its registration and the sale) are the seller's; those signed after, the buyer's. Unanswered,
    each owner is alerted for its own."""
    eu, task = inspector("inspect-eu"), a_task("inspect-eu")
    key = with_chip_key(task)
    eu.post(f"/api/inspections/tasks/{task.pk}/accept")
    # the chip's clock has whole seconds: registration < before < sale < after < the log's reading, to the second
    clock = LedgerClock()
    monkeypatch.setattr(timezone, "now", clock)
    before = clock.tick()
    clock.tick()
    seller, buyer = sell(task)
    after = clock.tick()
    clock.tick()
    read_log(eu, task, signed_log(key, task.chip.serial, [before, after]), django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        assert answer(buyer, task.chip.serial, 0).status_code == 400
        assert answer(seller, task.chip.serial, 1).status_code == 400
    assert not Claim.objects.exists()
    assert sweeps.unanswered_sweep(datetime.now(UTC).date() + timedelta(days=60)) == 2
    owed = {a.detail.split("#")[1][0]: a.prover.slug for a in Alert.objects.filter(kind="unanswered")}
    assert owed == {"0": seller.org.slug, "1": buyer.org.slug}
    with django_capture_on_commit_callbacks(execute=False):
        assert answer(seller, task.chip.serial, 0).status_code == 201
        assert answer(buyer, task.chip.serial, 1).status_code == 201
    assert Snapshot.objects.filter(chip=task.chip).count() == 2


# --- snapshots signed in the future (probe #12): a low alert naming them, never a tampered log ---------------


def test_snapshots_signed_after_the_log_was_read_are_a_low_alert_naming_them_and_the_log_stays_intact(
    draw, django_capture_on_commit_callbacks
):
    from inspections.severity import severity_of

    eu, task = inspector("inspect-eu"), a_task("inspect-eu")
    key = with_chip_key(task)
    now = datetime.now(UTC)
    times = [
        now - timedelta(days=1),
        now + timedelta(minutes=5),
        now + timedelta(days=2),
        datetime(2099, 1, 1, tzinfo=UTC),
    ]
    read_log(eu, task, signed_log(key, task.chip.serial, times), django_capture_on_commit_callbacks)
    alert = Alert.objects.get(kind="clock_ahead")  # within the skew allowance, #1 is not named
    assert alert.task == task and alert.prover == task.prover and severity_of(alert.kind) == "low"
    assert "2 snapshot(s)" in alert.detail and "#2 at " in alert.detail and "#3 at 2099-01-01T00:00:00Z" in alert.detail
    assert "#1 at" not in alert.detail
    assert not Alert.objects.filter(kind="log_problems").exists()  # a wrong clock is no forgery
    assert Snapshot.objects.filter(chip=task.chip).count() == 4
    assert Entry.objects.filter(kind="alert.raised", payload__kind="clock_ahead").exists()


def test_a_log_signed_in_the_past_raises_no_clock_alert(draw, django_capture_on_commit_callbacks):
    eu, task = inspector("inspect-eu"), a_task("inspect-eu")
    key = with_chip_key(task)
    read_log(eu, task, firmware_log(key, task.chip.serial, 3), django_capture_on_commit_callbacks)
    assert not Alert.objects.exists()
