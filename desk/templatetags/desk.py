from django import template

from rules import units

register = template.Library()
register.filter("flops", units.flops)
register.filter("flop_rate", units.flop_rate)
register.filter("bytes", units.size_bytes)


@register.filter
def get(mapping, key):
    return (mapping or {}).get(key, "")
