"""Export licences: recorded by the regulator on the ledger; every border crossing cites one."""

from __future__ import annotations

import re
from datetime import date

from django.db import transaction
from django.utils import timezone

from ledger import services as ledger
from rules.identifiers import COUNTRY

from ..models import ExportLicence, Organisation
from .common import fail, organisation_by_slug

LICENCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,63}")
MAX_QUANTITY = 10**7


@transaction.atomic
def export_licence_grant(
    *,
    licence_id: str,
    exporter: str,
    consignee: str,
    from_country: str,
    to_country: str,
    quantity: int,
    expires_on: str,
    actor: str = "regulator",
) -> ExportLicence:
    if not isinstance(licence_id, str) or not LICENCE_ID.fullmatch(licence_id):
        fail("licence_id", "1-64 characters of letters, digits, '.', '_', '/' or '-'")
    ledger.ledger_write_lock()  # a twin recorded at the same moment is committed before the check: refused by name
    if ExportLicence.objects.filter(licence_id=licence_id).exists():
        fail("licence_id", f"{licence_id!r} is already recorded")
    exporter_org = organisation_by_slug(exporter, "exporter")
    consignee_org = organisation_by_slug(consignee, "consignee")
    for name, code in (("from_country", from_country), ("to_country", to_country)):
        if not isinstance(code, str) or not COUNTRY.fullmatch(code):
            fail(name, "ISO 3166-1 alpha-2 code, e.g. 'NL'")
    if from_country == to_country:
        fail("to_country", "an export licence is for a border crossing")
    if isinstance(quantity, bool) or not isinstance(quantity, int) or not 0 < quantity <= MAX_QUANTITY:
        fail("quantity", f"a whole number of chips from 1 to {MAX_QUANTITY}")
    try:
        expiry = date.fromisoformat(expires_on) if isinstance(expires_on, str) and len(expires_on) == 10 else None
    except ValueError:
        expiry = None
    if expiry is None:
        fail("expires_on", "a date, YYYY-MM-DD")
    payload = {
        "licence_id": licence_id,
        "exporter": exporter_org.slug,
        "consignee": consignee_org.slug,
        "from_country": from_country,
        "to_country": to_country,
        "quantity": quantity,
        "expires_on": expiry.isoformat(),
    }
    entry = ledger.append_entry("export_licence.granted", payload, actor)
    return ExportLicence.objects.create(
        licence_id=licence_id,
        exporter=exporter_org,
        consignee=consignee_org,
        from_country=from_country,
        to_country=to_country,
        quantity=quantity,
        expires_on=expiry,
        granted_seq=entry.seq,
    )


def export_licence_use(licence_id: str, exporter: Organisation, consignee: str, countries: set[str], to: str, n: int):
    """Check that the cited licence covers this export of ``n`` chips from ``countries`` and count them against it."""
    licence = ExportLicence.objects.select_for_update(no_key=True).filter(licence_id=licence_id).first()
    if licence is None:
        fail("export_licence", f"no export licence {licence_id!r} is recorded")
    problems = []
    if licence.exporter_id != exporter.pk:
        problems.append(f"is granted to {licence.exporter.slug}, not {exporter.slug}")
    if licence.consignee.slug != consignee:
        problems.append(f"names consignee {licence.consignee.slug}, not {consignee}")
    if countries != {licence.from_country}:
        problems.append(f"covers exports from {licence.from_country}, not from {', '.join(sorted(countries))}")
    if licence.to_country != to:
        problems.append(f"covers exports to {licence.to_country}, not to {to}")
    if licence.expires_on < timezone.now().date():
        problems.append(f"expired on {licence.expires_on}")
    if licence.used + n > licence.quantity:
        problems.append(f"has {licence.quantity - licence.used} of {licence.quantity} chips left, not {n}")
    if problems:
        fail("export_licence", f"{licence_id}: " + "; ".join(problems))
    licence.used += n
    licence.save(update_fields=["used"])
