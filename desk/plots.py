"""Dashboard plots: matplotlib (Agg) to inline SVG, server-side — no JavaScript chart library, no CDN.

matplotlib (with numpy and Pillow) is imported on the first plot, not with this module: the web, worker and
beat processes import it through the URLs and tasks, and start and stop (Ctrl-C) seconds faster without it.
"""

from __future__ import annotations

import functools
import io
import math
from datetime import UTC, datetime, timedelta

SIZE = (5.2, 2.6)


@functools.cache
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "svg.fonttype": "none", "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    pyplot().close(figure)
    text = buffer.getvalue()
    text = text.replace(' target="_blank"', "")  # matplotlib opens links in a new tab: a drill-down stays in this one
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: the SVG is inlined in HTML


def count_axis(axis) -> None:
    """A count's axis: whole-number ticks (no 7.5 entries), large ones as 12k."""
    from matplotlib.ticker import EngFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axis.set_major_formatter(EngFormatter())


def bars(rows: list[list], title: str, link=None) -> str:
    """Horizontal bars; ``link(label)`` gives each bar's URL (the filtered list behind it), or None for none."""
    figure, axes = pyplot().subplots(figsize=SIZE)
    labels = [str(label) for label, _ in rows][::-1]
    drawn = axes.barh(labels, [n for _, n in rows][::-1], color="#417690")
    for bar, label in zip(drawn, [label for label, _ in rows][::-1], strict=True):
        url = link(label) if link else None
        if url:
            bar.set_url(url)  # the SVG wraps the bar in <a href>: a click opens the list
    count_axis(axes.xaxis)
    axes.set_title(title, loc="left")
    return _svg(figure)


def lines(series: dict[str, list[tuple]], title: str, days: int) -> str:
    figure, axes = pyplot().subplots(figsize=SIZE)
    today = datetime.now(UTC).date()
    axes.set_xlim(today - timedelta(days=days), today + timedelta(days=1))
    for name, points in series.items():
        if points:
            axes.plot([day for day, _ in points], [n for _, n in points], marker=".", label=name)
    axes.set_title(title, loc="left")
    axes.set_ylim(bottom=0)  # from zero: three days of 6, 8 and 11 entries are not a steep climb
    count_axis(axes.yaxis)
    if any(series.values()):
        axes.legend(frameon=False)
    else:
        axes.text(0.5, 0.5, "no entries in this window", ha="center", transform=axes.transAxes)
    figure.autofmt_xdate()
    return _svg(figure)


def detection_curve(
    curves: dict[str, list[tuple[int, float]]], target: float, planned: dict[str, int], title: str
) -> str:
    """Detection probability over samples per period, one line per model, with the target and the plan marked."""
    figure, axes = pyplot().subplots(figsize=SIZE)
    for name, points in curves.items():
        if points:
            axes.plot([s for s, _ in points], [p for _, p in points], label=name)
    axes.axhline(target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:g}")
    for name, samples in planned.items():
        if samples is not None and math.isfinite(samples):
            axes.axvline(samples, linestyle=":", linewidth=0.8, color="#ba2121")
            axes.annotate(f"{name}: {samples}", (samples, 0.05), fontsize=7, rotation=90)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("samples per period")
    axes.set_ylabel("P(detect run)")
    axes.set_title(title, loc="left")
    axes.legend(frameon=False, loc="lower right")
    return _svg(figure)
