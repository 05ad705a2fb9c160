"""Demo world for `make run` (idempotent), written through the services so the ledger holds it all.

A fab and a packager in Taiwan, two vendors, three owners with data centres in
three countries, a regulator and an inspection body; chips with realistic
histories: fabricated, packaged, exported under licence, sold (transfer offer
and acceptance), shipped, installed — plus pending transfers, a re-export and a
lost chip. Each organisation's signing key is kept in var/demo-keys/ so the
documented client examples can sign as it.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from nacl.signing import SigningKey

from ledger import services as ledger_services

from . import services
from .models import ApiToken, Chip, ExportLicence, Organisation
from .services.roles import AUDITOR, REGULATOR_STAFF, role_grant
from .services.tokens import api_token_issue, api_token_revoke, api_token_user

PASSWORD_FILE = "demo-password"
GIB = 2**30

ORGANISATIONS = [
    # slug, legal name, country, roles
    ("regulator", "Compute Oversight Authority", "US", ["regulator"]),
    ("inspect-eu", "European Chip Inspectorate", "NL", ["inspection_body"]),
    ("fab-tw", "Formosa Foundry Co.", "TW", ["fab"]),
    ("pack-tw", "Taoyuan Advanced Packaging", "TW", ["packager"]),
    ("vendor-a", "Apex Accelerators Inc.", "US", ["vendor"]),
    ("vendor-b", "Benelux Compute Distribution B.V.", "NL", ["vendor"]),
    ("owner-a", "Aurora AI Labs", "US", ["owner"]),
    ("owner-b", "Brightwater Cloud B.V.", "NL", ["owner"]),
    ("owner-c", "Crescent Compute LLC", "AE", ["owner"]),
]
FACILITIES = [
    # owner, slug, kind, country, location
    ("fab-tw", "fab-tw-hsinchu", "fab", "TW", "Hsinchu Science Park"),
    ("pack-tw", "pack-tw-taoyuan", "packaging", "TW", "Taoyuan"),
    ("vendor-a", "wh-vendor-a-nj", "warehouse", "US", "Newark, NJ"),
    ("vendor-b", "wh-vendor-b-ams", "warehouse", "NL", "Schiphol"),
    ("owner-a", "dc-owner-a-or", "datacentre", "US", "The Dalles, OR"),
    ("owner-b", "dc-owner-b-ams", "datacentre", "NL", "Amsterdam"),
    ("owner-c", "dc-owner-c-auh", "datacentre", "AE", "Abu Dhabi"),
]
# Published peak dense (no sparsity) 16-bit FLOP/s and memory of each model.
CHIP_MODELS = [
    ("vendor-a", "h100-sxm", "H100 SXM5 80GB", 989.4e12, 80 * GIB),
    ("vendor-a", "h200-sxm", "H200 SXM 141GB", 989.4e12, 141 * GIB),
    ("vendor-a", "b200", "B200 180GB", 2.25e15, 180 * GIB),
    ("vendor-b", "mi300x", "MI300X 192GB", 1307.4e12, 192 * GIB),
]
USERS = [
    # username, organisation, role in the demo, staff, superuser
    ("regulator", "regulator", "regulator: superuser of the admin", True, True),
    ("regulator-staff", "regulator", "regulator staff: registers organisations and campaigns", True, False),
    ("auditor", "regulator", "auditor: read-only staff in the admin, no secrets", True, False),
    ("vendor-a", "vendor-a", "vendor A: API client", False, False),
    ("vendor-b", "vendor-b", "vendor B: API client", False, False),
    ("owner-a", "owner-a", "owner A (a prover): API client", False, False),
    ("owner-b", "owner-b", "owner B (a prover): API client", False, False),
    ("inspector-a", "inspect-eu", "inspector of the inspection body", False, False),
]


@dataclass(frozen=True)
class DemoLogin:
    username: str
    role: str
    token: str


def demo_password(requested: str | None) -> tuple[str, bool]:
    """The demo password: the one asked for, else one generated once and kept in var/."""
    path = settings.VAR_DIR / PASSWORD_FILE
    if requested:
        return requested, False
    if path.exists():
        return path.read_text().strip(), False
    password = secrets.token_urlsafe(12)
    path.write_text(password + "\n")
    path.chmod(0o600)
    return password, True


MIN_CHIPS = 50  # enough for every story below


@transaction.atomic
def seed_demo(password: str, chips: int = 5000) -> list[DemoLogin]:
    if chips < MIN_CHIPS:
        raise ValueError(f"the demo world needs at least {MIN_CHIPS} chips")
    ledger_services.ledger_open()  # the ledger writes its own genesis; a no-op once it is open
    if not Organisation.objects.filter(slug="fab-tw").exists():
        _seed_world(chips)
    return [_user(*spec, password) for spec in USERS]


def _seed_world(chips: int) -> None:
    orgs = {slug: _organisation(slug, name, country, roles) for slug, name, country, roles in ORGANISATIONS}
    for owner, slug, kind, country, location in FACILITIES:
        services.facility_register(
            owner=orgs[owner], slug=slug, kind=kind, country=country, location=location, actor=owner
        )
    for vendor, slug, name, flops, memory in CHIP_MODELS:
        services.chip_model_register(
            vendor=orgs[vendor],
            slug=slug,
            name=name,
            export_class="3A090.a",
            peak_flops_16bit=flops,
            memory_bytes=memory,
            actor="regulator",
        )
    _seed_chips(orgs, chips)


def _organisation(slug: str, name: str, country: str, roles: list[str]) -> Organisation:
    org = services.organisation_register(slug=slug, legal_name=name, country=country, roles=roles, actor="regulator")
    key = SigningKey.generate()
    services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
    folder = settings.DEMO_KEY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{slug}.key"
    path.write_text(base64.b64encode(bytes(key)).decode() + "\n")
    path.chmod(0o600)
    return org


def _seed_chips(orgs: dict[str, Organisation], total: int) -> None:
    """Lots of chips flow fab → packager → vendor → owners; a few keep unfinished stories."""
    a_share, b_share = total * 3 // 5, total - total * 3 // 5
    lot_a = _fabricate(orgs, "A", ["h100-sxm", "h200-sxm", "b200"], a_share)
    lot_b = _fabricate(orgs, "B", ["mi300x"], b_share)
    for lot, vendor, warehouse in ((lot_a, "vendor-a", "wh-vendor-a-nj"), (lot_b, "vendor-b", "wh-vendor-b-ams")):
        _package_and_export(orgs, lot, vendor, warehouse)
    # vendor A sells to owner A at home and exports to owner C; vendor B sells to owner B at home.
    third = len(lot_a) // 3
    _sell(orgs, "vendor-a", "owner-a", lot_a[: third * 2], "dc-owner-a-or", export_licence=None)
    _sell(orgs, "vendor-a", "owner-c", lot_a[third * 2 : -20], "dc-owner-c-auh", export_licence="US-BIS-EL-2026-0113")
    _sell(orgs, "vendor-b", "owner-b", lot_b[:-10], "dc-owner-b-ams", export_licence=None)
    # Unfinished stories: chips still in the vendors' warehouses, one with a transfer pending,
    # a re-export from owner B (NL) to owner C (AE), and a chip owner A reported lost.
    _event(orgs, "vendor-b", "transfer_offered", lot_b[-10:-5], to_owner="owner-b")
    _event(orgs, "owner-b", "removed", lot_b[:2])
    _event(
        orgs,
        "owner-b",
        "exported",
        lot_b[:2],
        consignee="owner-c",
        reference="RESALE-17",
        export_licence="NL-CDIU-2026-0042",
    )
    _event(orgs, "owner-a", "reported_lost", lot_a[:1])


def _fabricate(orgs, lot: str, models: list[str], count: int) -> list[str]:
    serials = []
    for start in range(0, count, services.MAX_CHIPS):  # one request (one ledger entry) holds at most MAX_CHIPS
        batch = [
            {
                "serial": f"{lot}{n:06d}",
                "model": models[n % len(models)],
                "facility": "fab-tw-hsinchu",
                "public_key": base64.b64encode(bytes(SigningKey.generate().verify_key)).decode(),
            }
            for n in range(start, min(start + services.MAX_CHIPS, count))
        ]
        services.chips_fabricate(organisation=orgs["fab-tw"], chips=batch)
        serials += [item["serial"] for item in batch]
    return serials


def _package_and_export(orgs, serials: list[str], vendor: str, warehouse: str) -> None:
    _event(orgs, "fab-tw", "shipped", serials, consignee="pack-tw", reference="WO-TW-PKG")
    _event(orgs, "pack-tw", "received", serials, facility="pack-tw-taoyuan")
    _event(orgs, "pack-tw", "packaged", serials, facility="pack-tw-taoyuan")
    _event(
        orgs,
        "pack-tw",
        "exported",
        serials,
        consignee=vendor,
        reference=f"PO-{vendor}",
        export_licence=f"TW-MOEA-2026-{vendor}",
    )
    _event(orgs, vendor, "received", serials, facility=warehouse)
    _event(orgs, "fab-tw", "transfer_offered", serials, to_owner=vendor, reference=f"INV-{vendor}")
    _event(orgs, vendor, "transfer_accepted", serials)


def _sell(orgs, vendor: str, owner: str, serials: list[str], datacentre: str, export_licence: str | None) -> None:
    if export_licence:
        _event(
            orgs, vendor, "exported", serials, consignee=owner, reference=f"SO-{owner}", export_licence=export_licence
        )
    else:
        _event(orgs, vendor, "shipped", serials, consignee=owner, reference=f"SO-{owner}")
    _event(orgs, owner, "received", serials, facility=datacentre)
    _event(orgs, owner, "installed", serials, facility=datacentre)
    _event(orgs, vendor, "transfer_offered", serials, to_owner=owner, reference=f"SO-{owner}")
    _event(orgs, owner, "transfer_accepted", serials)


def _event(orgs, actor: str, event: str, serials: list[str], **fields) -> None:
    if fields.get("export_licence") and serials:  # the regulator records the licence the export cites
        licence_record(actor, fields["export_licence"], fields["consignee"], serials)
    for start in range(0, len(serials), services.MAX_CHIPS):
        payload = {"chips": serials[start : start + services.MAX_CHIPS], **fields}
        services.chips_record_event(organisation=orgs[actor], event=event, payload=payload)


def licence_record(exporter: str, licence_id: str, consignee: str, serials: list[str]) -> None:
    """As the regulator would before the export that cites it: a licence for exactly these chips, once."""
    if ExportLicence.objects.filter(licence_id=licence_id).exists():
        return
    services.export_licence_grant(
        licence_id=licence_id,
        exporter=exporter,
        consignee=consignee,
        from_country=Chip.objects.get(serial=serials[0]).country,
        to_country=Organisation.objects.get(slug=consignee).country,
        quantity=len(serials),
        expires_on=f"{timezone.now().year + 1}-12-31",
    )


def _user(username: str, organisation: str, role: str, staff: bool, superuser: bool, password: str) -> DemoLogin:
    user, _ = get_user_model().objects.get_or_create(username=username)
    user.is_staff, user.is_superuser = staff, superuser
    user.set_password(password)
    user.save()
    if staff and not superuser:
        role_grant(user, AUDITOR if username == "auditor" else REGULATOR_STAFF)
    services.member_add(user, Organisation.objects.get(slug=organisation))
    return DemoLogin(username, role, demo_token(user))


def demo_token(user) -> str:
    """The database keeps only the token's hash; the demo keeps the token in var/ (like its keys) to print it."""
    path = settings.DEMO_TOKEN_DIR / user.username
    if path.exists():
        token = path.read_text().strip()
        if api_token_user(token) == user:
            return token
    for old in ApiToken.objects.filter(user=user, label="demo", revoked_at__isnull=True):
        api_token_revoke(old)
    _, token = api_token_issue(user, "demo")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token
