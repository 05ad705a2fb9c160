"""Organisations, their members and signing keys, and the check of a signed request."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from django.db import IntegrityError, transaction
from nacl.bindings import crypto_core_ed25519_is_valid_point

from ledger import services as ledger
from rules.identifiers import SLUG, SYSTEM

from .. import signing
from ..models import ApiNonce, Member, Organisation, OrganisationKey, Role
from .common import country_check, fail, organisation_by_slug


@transaction.atomic
def organisation_register(
    *, slug: str, legal_name: str, country: str, roles: Sequence[str], actor: str, parent: str | None = None
) -> Organisation:
    if not SLUG.fullmatch(slug or ""):
        fail("slug", "lower-case letters, digits and hyphens, at most 64")
    if Organisation.objects.filter(slug=slug).exists() or slug == SYSTEM:
        fail("slug", f"{slug!r} is taken")
    country_check(country)
    unknown = set(roles) - set(Role.values)
    if not roles or unknown:
        fail("roles", f"one or more of {sorted(Role.values)}")
    parent_org = organisation_by_slug(parent, "parent") if parent else None
    payload = {
        "slug": slug,
        "legal_name": legal_name,
        "country": country,
        "roles": sorted(set(roles)),
        "parent": parent,
    }
    entry = ledger.append_entry("org.registered", payload, actor)
    return Organisation.objects.create(
        slug=slug,
        legal_name=legal_name,
        country=country,
        roles=payload["roles"],
        parent=parent_org,
        registered_seq=entry.seq,
    )


@transaction.atomic
def organisation_key_register(
    *, organisation: Organisation, public_key: bytes, actor: str, submission: dict | None = None
) -> OrganisationKey:
    _keys_locked(organisation)
    key_id = _new_key_id(public_key)
    payload = {"org": organisation.slug, "key_id": key_id, "public_key": base64.b64encode(public_key).decode()}
    entry = ledger.append_entry("org.key_registered", payload, actor, submission)
    return OrganisationKey.objects.create(
        organisation=organisation, key_id=key_id, public_key=public_key, registered_seq=entry.seq
    )


def _keys_locked(organisation: Organisation) -> None:
    """Lock the organisation's row before its keys change (register, revoke, replace): one at a time, each sees the
    keys as the last one left them. Two revocations at once both saw the other key active, and left none."""
    list(Organisation.objects.select_for_update(no_key=True).filter(pk=organisation.pk).values_list("pk"))


def _new_key_id(public_key: bytes) -> str:
    """The key id of a usable Ed25519 public key not yet registered, or a 400 naming ``public_key``.

    libsodium's point check refuses what no signing key has as its public key: bytes off the curve and the
    small-order points (all zeros among them), for which forged signatures verify against any message."""
    if len(public_key) != 32:
        fail("public_key", "an Ed25519 public key is 32 bytes")
    if not crypto_core_ed25519_is_valid_point(public_key):
        fail("public_key", "not a usable Ed25519 public key (off the curve or of small order)")
    key_id = signing.key_id_for(public_key)
    if OrganisationKey.objects.filter(key_id=key_id).exists():
        fail("public_key", "this key is already registered")
    return key_id


@transaction.atomic
def organisation_key_revoke(
    *, organisation: Organisation, key_id: str, actor: str, submission: dict | None = None
) -> OrganisationKey:
    _keys_locked(organisation)
    key = OrganisationKey.objects.filter(organisation=organisation, key_id=key_id).first()
    if key is None or key.revoked_seq is not None:
        fail("key_id", f"no active key {key_id!r} of {organisation.slug}")
    if not OrganisationKey.objects.filter(organisation=organisation, revoked_seq=None).exclude(pk=key.pk).exists():
        # nothing could sign afterwards, not even a new key; a lost key is replaced by the regulator instead
        fail("key_id", f"{key_id!r} is the only active key of {organisation.slug}: register another key first")
    entry = ledger.append_entry("org.key_revoked", {"org": organisation.slug, "key_id": key_id}, actor, submission)
    key.revoked_seq = entry.seq
    key.save(update_fields=["revoked_seq"])
    return key


MAX_REASON = 2000


@transaction.atomic
def organisation_key_replace(
    *, organisation: Organisation, public_key: bytes, reason: str, actor: str = "regulator"
) -> OrganisationKey:
    """The regulator registers a replacement for an organisation that lost its key: every active key is revoked
    and the new one registered, each entry carrying the reason (the organisation cannot sign for itself any more)."""
    reason = reason.strip() if isinstance(reason, str) else ""
    if not reason or "\x00" in reason or len(reason) > MAX_REASON:
        fail("reason", f"say why the key is replaced (1 to {MAX_REASON} characters, no NUL)")
    _keys_locked(organisation)
    key_id = _new_key_id(public_key)
    lost = list(OrganisationKey.objects.filter(organisation=organisation, revoked_seq=None).order_by("pk"))
    for old in lost:
        payload = {"org": organisation.slug, "key_id": old.key_id, "reason": reason}
        old.revoked_seq = ledger.append_entry("org.key_revoked", payload, actor).seq
        old.save(update_fields=["revoked_seq"])
    payload = {
        "org": organisation.slug,
        "key_id": key_id,
        "public_key": base64.b64encode(public_key).decode(),
        "replaces": sorted(old.key_id for old in lost),
        "reason": reason,
    }
    entry = ledger.append_entry("org.key_registered", payload, actor)
    return OrganisationKey.objects.create(
        organisation=organisation, key_id=key_id, public_key=public_key, registered_seq=entry.seq
    )


@transaction.atomic
def member_add(user, organisation: Organisation, actor: str = "regulator") -> Member:
    """Let ``user`` act for ``organisation`` (or move it there): an ``org.member_added`` entry.

    Staff act for the regulator only: a staff user cannot join (or be moved into) any other organisation, so it
    can never write as an inspection body or a vendor. A user holding live API tokens is not moved: its tokens
    were issued to act for its organisation (revoke them first). The entry names the user by id, not by name.
    """
    if (user.is_staff or user.is_superuser) and not organisation.has_role(Role.REGULATOR):
        fail("organisation", "staff users act for the regulator only; they cannot join another organisation")
    # the user's row first: with no membership yet there is no Member row to lock, and two adds sent at once
    # (a double Save) would both see none and write two entries
    list(type(user).objects.select_for_update(no_key=True).filter(pk=user.pk).values_list("pk"))
    current = Member.objects.select_for_update(no_key=True).filter(user=user).first()
    if current is not None and current.organisation_id == organisation.pk:
        return current
    if current is not None and user.api_tokens.filter(revoked_at=None).exists():
        fail("user", f"holds API tokens issued for {current.organisation.slug}: revoke them before moving the user")
    payload = {"org": organisation.slug, "user": user.pk, "from": current.organisation.slug if current else None}
    ledger.append_entry("org.member_added", payload, actor)
    member, _ = Member.objects.update_or_create(user=user, defaults={"organisation": organisation})
    return member


@transaction.atomic
def member_remove(member: Member, actor: str = "regulator") -> None:
    """The user no longer acts for the organisation: an ``org.member_removed`` entry. The row is locked first: a
    removal sent twice at once (two admins) writes one entry, and the second has nothing left to do."""
    locked = Member.objects.select_for_update(of=("self",)).select_related("organisation").filter(pk=member.pk)
    member = locked.first()  # FOR UPDATE, not no-key: this transaction deletes the row
    if member is None:
        return
    ledger.append_entry("org.member_removed", {"org": member.organisation.slug, "user": member.user_id}, actor)
    member.delete()


# --- signed requests ------------------------------------------------------------------


def signed_key_current(organisation: Organisation, signed: signing.SignedBody) -> None:
    """Inside a signed write's transaction, before its entry: the organisation's row locked (as a key change locks
    it first) and the signing key still active. The signature was checked before the transaction; a revocation
    committed since must not be followed on the ledger by a write its revoked key signed."""
    _keys_locked(organisation)
    key = OrganisationKey.objects.filter(organisation=organisation, key_id=signed.key_id).first()
    if key is None or key.revoked_seq is not None:
        seq = key.revoked_seq if key else None
        raise signing.SignatureProblem("signature", f"key {signed.key_id} was revoked at ledger seq {seq}")


def signed_body_check(organisation: Organisation, header: str | None, body: bytes, data: dict) -> signing.SignedBody:
    """Check a request's signature (by an active key of ``organisation``), timestamp and nonce form; write nothing.

    Raises ``signing.SignatureProblem`` naming the field. Runs before anything else looks at the request
    (idempotency answers included), so an unsigned request learns nothing.
    """
    key_id, signature = signing.parse_header(header)
    key = OrganisationKey.objects.filter(key_id=key_id, organisation=organisation).first()
    if key is None:
        raise signing.SignatureProblem("signature", f"key {key_id} is not registered to {organisation.slug}")
    if key.revoked_seq is not None:
        raise signing.SignatureProblem("signature", f"key {key_id} was revoked at ledger seq {key.revoked_seq}")
    signing.verify(bytes(key.public_key), body, signature)
    stamp, nonce = signing.check_freshness(data)
    return signing.SignedBody(key_id, body, signature, stamp, nonce)


def signed_nonce_consume(organisation: Organisation, signed: signing.SignedBody) -> None:
    """Spend the nonce of a validly signed request, whatever then becomes of the request.

    Its own (committed) transaction: a request refused later (400, 409) keeps its nonce spent, so a captured
    refused request cannot be replayed once the world has changed so that it would pass.
    """
    try:
        with transaction.atomic():
            ApiNonce.objects.create(organisation=organisation, nonce=signed.nonce)
    except IntegrityError:
        raise signing.SignatureProblem("nonce", "already used: this request was replayed") from None


def signed_body_accept(organisation: Organisation, header: str | None, body: bytes, data: dict) -> signing.SignedBody:
    """``signed_body_check`` then ``signed_nonce_consume``: for signed writes without an Idempotency-Key."""
    signed = signed_body_check(organisation, header, body, data)
    signed_nonce_consume(organisation, signed)
    return signed
