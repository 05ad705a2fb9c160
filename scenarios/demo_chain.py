"""The demo's chain of guarantees (``seed_demo``): an honest and a cheating prover, every link run.

On top of the demo world: two labs in the US buy 8 chips each from vendor-a (chips whose keys the chip
simulator keeps in CHIP_KEY_DIR); both train a small model on them; campaign ``chain-demo`` draws
every one of their chips; the inspector checks each chip's identity and reads its log — all but one
chip of lab-honest, left for the README's inspector walkthrough; the logs are checked; lab-honest
answers its snapshots with its transcript, lab-cheat with a decoy's. The worker of ``make run``
replays the claims: lab-honest's verify, lab-cheat's are mismatches, alerts on the ledger.
"""

from __future__ import annotations

import base64
import json

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from nacl.signing import SigningKey

from inspections.models import InspectionTask, SnapshotLog
from inspections.services import campaigns, inspectors
from registry import services
from registry.demo_registry import demo_token
from registry.models import Organisation

from .actors import World

LABS = [("lab-honest", "Honest Labs Inc."), ("lab-cheat", "Corner-Cutting Labs Inc.")]
CAMPAIGN = "chain-demo"


def seed_chain(password: str) -> list[tuple[str, str, str]]:
    """Idempotent. Returns the labs' logins (username, role, API token)."""
    world = World()
    if not Organisation.objects.filter(slug="lab-honest").exists():
        _build(world, password)
    return [
        (slug, f"{name} (a prover): API client", demo_token(get_user_model().objects.get(username=slug)))
        for slug, name in LABS
    ]


def _build(world: World, password: str) -> None:
    chips = {}
    for n, (slug, name) in enumerate(LABS):
        _lab(world, slug, name, password)
        chips[slug] = _buy(world, slug, lot="HC"[n])
    honest = world.train("lab-honest", chips["lab-honest"], seed=6, rate=0.02)
    cheat = world.train("lab-cheat", chips["lab-cheat"], seed=9, rate=0.02)
    decoy = world.train_off_chips("lab-cheat", chips["lab-cheat"], seed=90)
    campaign = campaigns.campaign_create(
        slug=CAMPAIGN,
        provers=[slug for slug, _ in LABS],
        rule_flops=1e21,
        starts_on=timezone.now().date(),
        detection_probability=0.999,
        period_days=30,
        run_days=30,
    )
    campaigns.campaign_draw(campaign, 0)
    left = _walkthrough_task(world)
    for task in InspectionTask.objects.filter(draw__campaign=campaign).exclude(pk=left.pk).select_related("chip"):
        world.inspect(task)
    for log in SnapshotLog.objects.filter(status=SnapshotLog.Status.PENDING):
        inspectors.snapshot_log_check(log.pk)  # here, so the labs can answer now; the worker would do the same
    world.answer_snapshots("lab-honest", honest)
    # The cheat answers with a decoy run's transcript (its manifest, its location) for the steps its chips logged.
    decoy_manifest = json.loads((decoy / "claims.json").read_text())["manifest"]
    world.answer_snapshots("lab-cheat", cheat, manifest=decoy_manifest, location=decoy)


def _lab(world: World, slug: str, name: str, password: str) -> None:
    org = services.organisation_register(slug=slug, legal_name=name, country="US", roles=["owner"], actor="regulator")
    key = world.keys[slug] = _demo_key(slug)
    services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
    services.facility_register(
        owner=org, slug=f"dc-{slug}", kind="datacentre", country="US", location="Ashburn, VA", actor=slug
    )
    user, _ = get_user_model().objects.get_or_create(username=slug)
    user.set_password(password)
    user.save()
    services.member_add(user, org)
    world.tokens[slug] = demo_token(user)


def _demo_key(slug: str) -> SigningKey:
    key = SigningKey.generate()
    settings.DEMO_KEY_DIR.mkdir(parents=True, exist_ok=True)
    path = settings.DEMO_KEY_DIR / f"{slug}.key"
    path.write_text(base64.b64encode(bytes(key)).decode() + "\n")
    path.chmod(0o600)
    return key


def _buy(world: World, owner: str, lot: str) -> list[str]:
    serials = [f"{lot}{n:06d}" for n in range(8)]
    items = [
        {"serial": s, "model": "h100-sxm", "facility": "fab-tw-hsinchu", "public_key": world.chips.make(s)}
        for s in serials
    ]
    services.chips_fabricate(organisation=Organisation.objects.get(slug="fab-tw"), chips=items)
    world.event(
        "fab-tw", "exported", serials, consignee="vendor-a", reference="PO-LABS", export_licence=f"TW-EL-LABS-{lot}"
    )
    world.event("vendor-a", "received", serials, facility="wh-vendor-a-nj")
    world.event("fab-tw", "transfer_offered", serials, to_owner="vendor-a")
    world.event("vendor-a", "transfer_accepted", serials)
    world.event("vendor-a", "shipped", serials, consignee=owner, reference=f"SO-{owner}")
    world.event("vendor-a", "transfer_offered", serials, to_owner=owner)
    world.event(owner, "transfer_accepted", serials)
    world.event(owner, "received", serials, facility=f"dc-{owner}")
    world.event(owner, "installed", serials, facility=f"dc-{owner}")
    return serials


def _walkthrough_task(world: World) -> InspectionTask:
    """The task left for the README's inspector walkthrough: a lab-honest chip that logged snapshots."""
    tasks = InspectionTask.objects.filter(draw__campaign__slug=CAMPAIGN, prover__slug="lab-honest")
    for task in tasks.select_related("chip").order_by("chip__serial"):
        if world.chips.export(task.chip.serial).strip():
            return task
    return tasks.first()
