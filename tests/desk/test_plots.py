"""The dashboard's count plots: axes from zero, whole-number ticks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from desk import plots

TICK = re.compile(r'<g id="(?P<axis>[xy])tick_\d+">.*?<text[^>]*>(?P<label>[^<]*)</text>', re.DOTALL)


def tick_labels(svg: str, axis: str) -> list[str]:
    return [m["label"] for m in TICK.finditer(svg) if m["axis"] == axis]


def days_ago(n: int):
    return datetime.now(UTC).date() - timedelta(days=n)


def test_entries_per_day_start_at_zero_with_whole_number_ticks():
    svg = plots.lines({"chip.shipped": [(days_ago(2), 6), (days_ago(1), 8), (days_ago(0), 11)]}, "Entries", 30)
    labels = tick_labels(svg, "y")
    assert labels[0] == "0"  # was 6: three dots on a 6-11 axis read as a steep climb
    assert all(label.isdigit() for label in labels), labels
    assert int(labels[-1]) >= 10


def test_a_few_entries_get_no_fractional_ticks():
    svg = plots.lines({"claim.filed": [(days_ago(1), 1), (days_ago(0), 2)]}, "Entries", 30)
    labels = tick_labels(svg, "y")
    assert labels[0] == "0"
    assert all(label.isdigit() for label in labels), labels  # not 0.25, 0.5, ...


def test_bar_counts_have_whole_number_ticks():
    svg = plots.bars([["NL", 3], ["US", 1]], "Chips by country")
    labels = tick_labels(svg, "x")
    assert labels and all(label.isdigit() for label in labels), labels
