"""Reads of the registry: what a caller may see, chip histories with their ledger proofs."""
from __future__ import annotations

from django.db.models import Q, QuerySet

from ledger import selectors as ledger_selectors

from .models import Chip, ChipEvent, Member, Organisation, Role

SEES_EVERYTHING = {Role.REGULATOR, Role.INSPECTION_BODY}


def organisation_of(user) -> Organisation | None:
    member = Member.objects.select_related("organisation").filter(user_id=user.pk).first()
    return member.organisation if member else None


def chips_visible_to(organisation: Organisation) -> QuerySet[Chip]:
    """A vendor or owner sees its own chips and those consigned or offered to it; the regulator all."""
    chips = Chip.objects.select_related("model", "owner", "possessor", "facility", "consignee", "pending_owner", "fab")
    if SEES_EVERYTHING & set(organisation.roles):
        return chips
    me = organisation.pk
    return chips.filter(Q(owner_id=me) | Q(possessor_id=me) | Q(consignee_id=me) | Q(pending_owner_id=me) | Q(fab_id=me))


def chip_history(chip: Chip) -> list[dict]:
    """The chip's events in order, each with its RFC 9162 inclusion proof in the latest checkpoint."""
    checkpoint = ledger_selectors.checkpoint_latest()
    size = checkpoint.size if checkpoint else 0
    history = []
    for event in ChipEvent.objects.filter(chip=chip).order_by("seq"):
        proof = ledger_selectors.inclusion_proof(event.seq, size) if event.seq < size else None
        history.append({"seq": event.seq, "kind": event.kind, "actor": event.actor, "tree_size": size, "proof": proof})
    return history
