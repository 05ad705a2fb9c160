from django import template
from django.utils.html import format_html

from rules import units

register = template.Library()
register.filter("flops", units.flops)
register.filter("flop_rate", units.flop_rate)
register.filter("bytes", units.size_bytes)


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key, "")


@register.filter
def reveal(value, private):
    """Private case text for whom the view resolved it (``private``: commitment -> text); else "(private)".

    Entries from before the case files carry their text in clear: shown as it is.
    """
    if not value:
        return ""
    if str(value).startswith("sha256:"):
        return (private or {}).get(value, "(private)")
    return value


@register.inclusion_tag("admin/desk/_ledger_badge.html")
def ledger_badge():
    """The header's ledger badge, on every admin page (templates/admin/base_site.html)."""
    from desk import selectors  # the tag library loads before the apps' models are ready

    return {"badge": selectors.ledger_badge()}


@register.filter
def age(seconds):
    """Seconds as a person reads an age: "45 s", "12 min", "3 h", "2 d"."""
    if seconds is None:
        return "never"
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


@register.filter
def index(sequence, position):
    return sequence[position]


EVENT_NAMES = {
    "chip.transfer_accepted": "ownership transferred",
    "chip.reported_lost": "reported lost",
    "chip.reported_stolen": "reported stolen",
    "campaign.created": "campaign created",
    "campaign.seed_committed": "draw seed committed",
    "campaign.drawn": "drawn for inspection",
    "campaign.amended": "campaign amended",
    "campaign.stopped": "campaign stopped",
    "inspection.accepted": "inspection accepted",
    "inspection.identity_checked": "identity checked",
    "inspection.snapshot_log": "snapshot log uploaded",
    "inspection.finding": "inspection finding",
    "alert.raised": "alert raised",
    "alert.updated": "alert triaged",
    "claim.submitted": "claim filed",
    "claim.material_copied": "claim material copied",
    "claim.reverification_drawn": "re-verification nonce committed",
    "claim.verified": "claim verdict",
    "claim.verification_failed": "verifier failed (will retry)",
    "claim.conflict": "claims conflict",
    "org.registered": "organisation registered",
    "org.key_registered": "key registered",
    "org.key_revoked": "key revoked",
    "org.member_added": "member added",
    "org.member_removed": "member removed",
    "facility.registered": "facility registered",
}


@register.filter
def event_name(kind) -> str:
    """A ledger entry kind as a person reads it: "chip.shipped" -> "shipped"."""
    kind = str(kind or "")
    return EVENT_NAMES.get(kind) or kind.rpartition(".")[2].replace("_", " ")


@register.filter
def event(kind):
    """The readable name, with the kind itself on hover."""
    return format_html('<span title="{}">{}</span>', kind, event_name(kind))
