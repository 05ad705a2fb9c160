from django import template

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
