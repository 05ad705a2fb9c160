"""The people and chips of a scenario, acting on the system the way they would in the field.

Vendors, owners and the regulator write through the services (as the API and the admin do);
provers answer snapshots through the signed claims API; chips are ``replay.prover.chipsim`` chips whose
keys stay in a folder under ``VAR_DIR`` (never in the database); inspectors run the inspection
services; the Celery worker checks logs and replays transcripts. ``World`` only drives the
system: every verdict comes from the system itself.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import date, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from nacl.signing import SigningKey

from inspections.models import Alert, Campaign, Claim, InspectionTask, Snapshot, SnapshotLog
from inspections.services import bodies, campaigns, inspectors
from ledger import services as ledger
from registry import services, signing
from registry.demo_registry import licence_record
from registry.models import Organisation
from registry.services.tokens import api_token_issue
from replay.prover.chipsim import ChipStore

H100_FLOPS = 989.4e12
WAIT_SECONDS = 150  # the worker's share of a scenario; a scenario must end within two minutes here


class World:
    """An empty ledger, then whatever a scenario builds: organisations, chips, campaigns, training runs."""

    def __init__(self, chip_dir: Path | None = None, say=print):
        self.chips = ChipStore(chip_dir or settings.CHIP_KEY_DIR)
        self.keys: dict[str, SigningKey] = {}
        self.tokens: dict[str, str] = {}
        self.say = say
        self.lot = 0
        ledger.ledger_open()

    # --- organisations ------------------------------------------------------------------------------
    def organisation(self, slug: str, country: str, roles: list[str], datacentre: bool = False) -> Organisation:
        org = services.organisation_register(
            slug=slug, legal_name=slug.replace("-", " ").title(), country=country, roles=roles, actor="regulator"
        )
        self.keys[slug] = SigningKey.generate()
        services.organisation_key_register(
            organisation=org, public_key=bytes(self.keys[slug].verify_key), actor="regulator"
        )
        user, _ = get_user_model().objects.get_or_create(username=f"{slug}-api")
        services.member_add(user, org)
        self.tokens[slug] = api_token_issue(user, "scenario")[1]
        kind = {"fab": "fab", "vendor": "warehouse"}.get(roles[0], "datacentre")
        if datacentre or kind != "datacentre":
            services.facility_register(
                owner=org, slug=f"{kind[:2]}-{slug}", kind=kind, country=country, location=country, actor=slug
            )
        return org

    def standard(self) -> None:
        """The cast of most scenarios: a fab, a vendor, two provers in the US and a US inspectorate."""
        self.organisation("regulator", "US", ["regulator"])
        fab = self.organisation("fab-tw", "TW", ["fab"])
        self.organisation("vendor-us", "US", ["vendor"])
        self.organisation("prover-a", "US", ["owner"], datacentre=True)
        self.organisation("prover-b", "US", ["owner"], datacentre=True)
        self.organisation("inspect-us", "US", ["inspection_body"])
        bodies.inspection_body_register(organisation="inspect-us", countries=["US"], capacity_per_period=100)
        services.chip_model_register(
            vendor=fab,
            slug="h100-sxm",
            name="H100 SXM5 80GB",
            export_class="3A090.a",
            peak_flops_16bit=H100_FLOPS,
            memory_bytes=80 * 2**30,
            actor="regulator",
        )

    def event(self, actor: str, event: str, serials: list[str], **fields):
        if fields.get("export_licence"):  # the regulator records the licence an honest export cites
            licence_record(actor, fields["export_licence"], fields["consignee"], serials)
        return services.chips_record_event(
            organisation=Organisation.objects.get(slug=actor), event=event, payload={"chips": serials, **fields}
        )

    # --- chips --------------------------------------------------------------------------------------
    def fabricate(self, count: int) -> list[str]:
        """The fab makes chips: each chip makes its key (kept by the chip simulator); the fab registers the public half."""
        self.lot += 1
        serials = [f"P{self.lot:02d}{n:04d}" for n in range(count)]
        items = [
            {"serial": s, "model": "h100-sxm", "facility": "fa-fab-tw", "public_key": self.chips.make(s)}
            for s in serials
        ]
        services.chips_fabricate(organisation=Organisation.objects.get(slug="fab-tw"), chips=items)
        self.event(
            "fab-tw", "exported", serials, consignee="vendor-us", reference="PO-V", export_licence=f"TW-EL-{self.lot}"
        )
        self.event("vendor-us", "received", serials, facility="wa-vendor-us")
        self.event("fab-tw", "transfer_offered", serials, to_owner="vendor-us")
        self.event("vendor-us", "transfer_accepted", serials)
        return serials

    def sell(self, serials: list[str], owner: str, *, receive: bool = True) -> None:
        """The vendor ships and sells chips to an owner, who receives and installs them (unless ``receive`` is False)."""
        self.event("vendor-us", "shipped", serials, consignee=owner, reference=f"SO-{owner}")
        self.event("vendor-us", "transfer_offered", serials, to_owner=owner)
        self.event(owner, "transfer_accepted", serials)
        if receive:
            self.event(owner, "received", serials, facility=f"da-{owner}")
            self.event(owner, "installed", serials, facility=f"da-{owner}")

    def train(self, prover: str, serials: list[str], *, steps: int = 12, seed: int = 1, rate: float = 0.04) -> Path:
        """The prover trains a small model on these chips; the chips log signed snapshot hashes of its weights."""
        out = Path(settings.TRANSCRIPT_ROOTS[0]) / prover / f"run-{seed}"
        # dated after the chips' sale, just made: a snapshot before it would be the vendor's to answer
        self.chips.train(
            serials, out, arch="mlp", steps=steps, seed=seed, snapshot_rate=rate, not_before=timezone.now()
        )
        return out

    def train_off_chips(self, prover: str, serials: list[str], *, steps: int = 12, seed: int = 50) -> Path:
        """A run the registry's chips never saw (a decoy transcript laid out over the same chips)."""
        from replay.prover.recorder import Recorder  # torch only when training

        out = Path(settings.TRANSCRIPT_ROOTS[0]) / prover / f"decoy-{seed}"
        return Recorder(out, "mlp", steps=steps, seed=seed, serials=serials).run()

    # --- the regulator's campaign -------------------------------------------------------------------
    def campaign(self, provers: list[str], rule_flops: float = 1e21, slug: str = "frontier") -> Campaign:
        """A campaign whose plan inspects every chip of small provers (p = 0.999 over one 30-day period), drawn now."""
        campaign = campaigns.campaign_create(
            slug=slug,
            provers=provers,
            rule_flops=rule_flops,
            starts_on=timezone.now().date(),
            detection_probability=0.999,
            period_days=30,
            run_days=30,
        )
        campaigns.campaign_draw(campaign, 0)
        return campaign

    # --- inspectors ---------------------------------------------------------------------------------
    def tasks(self, prover: str | None = None):
        tasks = InspectionTask.objects.select_related("chip", "inspection_body", "prover").order_by("chip__serial")
        return list(tasks.filter(prover__slug=prover) if prover else tasks)

    def inspect(self, task: InspectionTask, *, log: str | None = None, finding: dict | None = None) -> dict:
        """Accept, check the chip's identity (the chip signs the challenge), upload its log, record the finding."""
        self.inspect_accept(task)
        outcome = self.identity(task)
        self.inspect_rest(task, log=log, finding=finding)
        return outcome

    def inspect_accept(self, task: InspectionTask) -> None:
        inspectors.task_accept(task, task.inspection_body)

    def inspect_rest(self, task, *, log: str | None = None, finding: dict | None = None, upload: bool = True):
        """After the identity check: read the chip's log off it and upload it (if any), record the finding."""
        text = self.chips.export(task.chip.serial) if log is None else log
        if upload and text.strip():
            self.upload(task, text)
        inspectors.finding_submit(task, task.inspection_body, finding or {"chip_found": True, "seal_intact": True})

    def upload(self, task: InspectionTask, text: str):
        return inspectors.snapshot_log_upload(task, task.inspection_body, text)

    def identity(self, task: InspectionTask, signature: str | None = None) -> dict:
        challenge = inspectors.identity_challenge_issue(task, task.inspection_body)
        answer = signature or self.chips.answer(task.chip.serial, challenge.nonce)
        return inspectors.identity_answer_check(task, task.inspection_body, challenge.nonce, answer)

    # --- provers ------------------------------------------------------------------------------------
    def answer_snapshots(
        self, prover: str, transcript: Path, *, run: str | None = None, manifest: str | None = None, location=None
    ):
        """The prover answers every logged snapshot of its chips from its own record, through the signed API; the
        run is named after its transcript folder, as ``python -m replay claim`` names it."""
        run = run or transcript.name
        recorded = json.loads((transcript / "claims.json").read_text())
        steps = {(c["serial"], c["counter"]): c["step"] for c in recorded["claims"]}
        logged = Snapshot.objects.filter(chip__owner__slug=prover, claim__isnull=True).select_related("chip")
        claims = [
            {
                "serial": s.chip.serial,
                "counter": s.counter,
                "run": run,
                "step": steps[(s.chip.serial, s.counter)],
                "manifest": manifest or recorded["manifest"],
                "location": str(location or transcript),
            }
            for s in logged
            if (s.chip.serial, s.counter) in steps
        ]
        if claims:
            self.post(prover, "/api/inspections/claims", {"claims": claims})
        return claims

    def post(self, org: str, path: str, data: dict) -> dict:
        body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(16), **data}).encode()
        response = Client().post(
            path,
            body,
            content_type="application/json",
            headers={"Authorization": f"Token {self.tokens[org]}", signing.HEADER: signing.sign(self.keys[org], body)},
        )
        if response.status_code != 201:
            raise RuntimeError(f"{path} refused ({response.status_code}): {response.content[:500]!r}")
        return response.json()

    # --- the worker ---------------------------------------------------------------------------------
    def wait_for_worker(self, deadline: float | None = None) -> bool:
        """Wait until the worker has checked every uploaded log and verified every claim (False on timeout)."""
        deadline = deadline or time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            pending = (
                SnapshotLog.objects.filter(status=SnapshotLog.Status.PENDING).count()
                + Claim.objects.filter(result=Claim.Result.PENDING).count()
            )
            if not pending:
                return True
            time.sleep(0.2)
        return False

    def later(self, days: int) -> date:
        return timezone.now().date() + timedelta(days=days)

    def alerts(self, kind: str | None = None, prover: str | None = None):
        alerts = Alert.objects.order_by("raised_seq")
        if kind:
            alerts = alerts.filter(kind=kind)
        if prover:
            alerts = alerts.filter(prover__slug=prover)
        return list(alerts)
