"""Registry factories: organisations with keys and users, chips, and a client that signs its requests."""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import time

from django.contrib.auth import get_user_model
from nacl.signing import SigningKey
from rest_framework.test import APIClient

from registry import services, signing
from registry.models import Chip, ChipModel, Facility, Organisation
from registry.services.tokens import api_token_issue

_serials = itertools.count(1)


def organisation(slug: str, roles: list[str], country: str = "US") -> tuple[Organisation, SigningKey]:
    org = services.organisation_register(
        slug=slug, legal_name=slug.title(), country=country, roles=roles, actor="regulator"
    )
    key = SigningKey.generate()
    services.organisation_key_register(organisation=org, public_key=bytes(key.verify_key), actor="regulator")
    return org, key


def facility(owner: Organisation, slug: str, kind: str = "datacentre", country: str | None = None):
    return services.facility_register(
        owner=owner, slug=slug, kind=kind, country=country or owner.country, actor=owner.slug
    )


def chip_model(vendor: Organisation, slug: str = "h100-sxm") -> ChipModel:
    return services.chip_model_register(
        vendor=vendor,
        slug=slug,
        name=slug.upper(),
        export_class="3A090.a",
        peak_flops_16bit=989e12,
        memory_bytes=80 * 2**30,
        actor="regulator",
    )


def chip_public_key() -> str:
    return base64.b64encode(bytes(SigningKey.generate().verify_key)).decode()


def new_serials(count: int, prefix: str = "SN") -> list[str]:
    return [f"{prefix}-{next(_serials):07d}" for _ in range(count)]


def fabricate(fab: Organisation, model: ChipModel, count: int, facility_slug: str | None = None) -> list[str]:
    serials = new_serials(count)
    chips = [{"serial": s, "model": model.slug, "public_key": chip_public_key()} for s in serials]
    if facility_slug:
        for chip in chips:
            chip["facility"] = facility_slug
    for start in range(0, len(chips), services.MAX_CHIPS):  # one request (one ledger entry) holds at most MAX_CHIPS
        services.chips_fabricate(organisation=fab, chips=chips[start : start + services.MAX_CHIPS])
    return serials


def event(org: Organisation, name: str, serials: list[str], **fields):
    if name == "exported" and fields.get("export_licence"):
        fields["export_licence"] = licence(org, fields["consignee"], serials, fields.get("destination")).licence_id
    if name in ("decommissioned", "destroyed"):
        fields = {"reason": "end_of_life", "evidence": "sha256:" + "ab" * 32, **fields}
    entry = None
    for start in range(0, len(serials), services.MAX_CHIPS):  # one request (one entry) holds at most MAX_CHIPS
        chunk = serials[start : start + services.MAX_CHIPS]
        entry = services.chips_record_event(organisation=org, event=name, payload={"chips": chunk, **fields})
    return entry


def licence(exporter: Organisation, consignee: str, serials: list[str], destination: str | None = None):
    """A licence the regulator recorded for exporting these chips from where they are to the consignee."""
    to = (
        Facility.objects.get(slug=destination).country
        if destination
        else Organisation.objects.get(slug=consignee).country
    )
    return services.export_licence_grant(
        licence_id=f"EL-{next(_serials):07d}",
        exporter=exporter.slug,
        consignee=consignee,
        from_country=Chip.objects.get(serial=serials[0]).country,
        to_country=to,
        quantity=len(serials),
        expires_on="2099-12-31",
    )


class SignedClient:
    """An API client acting for one organisation: token auth plus a signature on every write."""

    def __init__(self, org: Organisation, key: SigningKey):
        user = get_user_model().objects.create_user(username=f"user-{org.slug}-{secrets.token_hex(3)}")
        services.member_add(user, org)
        self.org, self.key = org, key
        self.api = APIClient()
        self.user = user
        self.api.credentials(HTTP_AUTHORIZATION=f"Token {api_token_issue(user)[1]}")

    def body(self, data: dict, timestamp: int | None = None, nonce: str | None = None) -> bytes:
        stamped = {
            "timestamp": int(time.time()) if timestamp is None else timestamp,
            "nonce": nonce or secrets.token_hex(12),
            **data,
        }
        return json.dumps(stamped).encode()

    def post(
        self,
        path: str,
        data: dict | None = None,
        *,
        raw: bytes | None = None,
        key: SigningKey | None = None,
        idempotency_key: str | None = None,
        signature: str | None = None,
        **stamp,
    ):
        body = raw if raw is not None else self.body(data or {}, **stamp)
        headers = {"HTTP_X_CHIPLEDGER_SIGNATURE": signature or signing.sign(key or self.key, body)}
        if idempotency_key:
            headers["HTTP_IDEMPOTENCY_KEY"] = idempotency_key
        return self.api.post(path, body, content_type="application/json", **headers)

    def get(self, path: str, **params):
        return self.api.get(path, params)
