"""What the desk's downloads share: plain-text CSV cells and file names that say what is inside and when.

A file name is ``<what>-<filter>-<value>...-<YYYY-MM-DD>.<ext>`` (the regulator's date), e.g.
``chips-owner-acme-status-in_stock-2026-11-26.csv``: two exports of different lists, or of one list on two days,
never share a name.
"""

from __future__ import annotations

import html
import re

from django.utils import timezone
from django.utils.html import strip_tags
from django.utils.safestring import SafeString

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")  # with full-width
NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_.]+")
IGNORED_PARAMETERS = {"o", "p", "all", "_changelist_filters", "e"}  # ordering, page, show-all: not a filter
MAX_NAME = 150


def csv_cell(value) -> str:
    """Plain text a spreadsheet shows as text: link columns lose their HTML, and no cell starts a formula
    (also after leading whitespace or control characters, which spreadsheets skip)."""
    text = "" if value is None else str(value)
    if isinstance(value, SafeString) or "<" in text:  # a link column (format_html): its visible text only
        text = html.unescape(strip_tags(text))
    stripped = text.lstrip(" \t\r\n\x0b\x0c")
    if text[:1] in FORMULA_STARTS or stripped[:1] in FORMULA_STARTS:
        return "'" + text
    return text


def _part(text: str) -> str:
    return NOT_IN_NAMES.sub("-", str(text)).strip("-.") or "x"


def export_filename(what: str, extension: str, filters=()) -> str:
    """``what``, each (parameter, value) filter in name order (``status__exact`` reads ``status``), today's date."""
    parts = [_part(what)]
    for name, value in sorted(filters):
        if name in IGNORED_PARAMETERS or value in ("", None):
            continue
        parts += [_part(name.removesuffix("__exact")), _part(value)]
    stem = "-".join(parts)[:MAX_NAME].rstrip("-.")
    return f"{stem}-{timezone.localdate().isoformat()}.{extension}"


def attachment(filename: str) -> str:
    """The Content-Disposition value; the name is already plain ASCII (``export_filename``)."""
    return f'attachment; filename="{filename}"'
