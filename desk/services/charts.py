"""The dashboard's plots, drawn by the beat task that refreshes the figures.

matplotlib takes 0.1-0.5 s a chart (2.5 s for the five at 10^6 chips on a busy host): drawn here, after each
refresh of the figures, the default dashboard (the first open campaign's curve) never waits for it. Another
campaign's curve is drawn on request and cached (desk.views).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from .. import plots, selectors
from ..models import Figure

NAME = "dashboard_charts"


def _chip_list(parameter: str):
    """Each bar's link: the chip list filtered by the bar's label (no link for a blank label)."""
    changelist = reverse("admin:registry_chip_changelist")
    # "other" is the figure's bucket for the owners past its top rows: no one list behind it.
    return lambda label: f"{changelist}?{urlencode({parameter: label})}" if label and label != "other" else None


def _curve_chart(campaign: dict) -> str:
    """Detection probability against samples per period for the campaign's largest possible prover."""
    found = selectors.detection_curves(campaign)
    if found is None:
        return "<p>No prover of this campaign could run the rule's training run.</p>"
    title = f"{campaign['slug']}: prover {found['prover']} ({found['chips']:,} chips)"
    return plots.detection_curve(found["curves"], campaign["target"], found["planned"], title)


def charts_draw(stored: dict, chosen: dict | None) -> dict[str, str]:
    """Title -> inline SVG of each dashboard plot, from the stored figures and the chosen campaign."""
    charts = {
        "Chips by country": plots.bars(stored["chips_by_country"].data, "Chips by country", _chip_list("country")),
        "Chips by owner": plots.bars(stored["chips_by_owner"].data, "Chips by owner", _chip_list("owner")),
        "Chips by model": plots.bars(stored["chips_by_model"].data, "Chips by model", _chip_list("model")),
        "Transfers and exports": plots.lines(
            selectors.series(), f"Entries per day (last {selectors.SERIES_DAYS} days)", selectors.SERIES_DAYS
        ),
    }
    if chosen:
        charts[f"Detection probability: {chosen['slug']}"] = _curve_chart(chosen)
    return charts


def charts_refresh() -> str:
    """Draw the default dashboard's plots (the first open campaign) and store them beside the figures."""
    stored = {name: figure for name, figure in selectors.figures().items() if name != NAME}
    campaigns = stored["open_campaigns"].data if "open_campaigns" in stored else []
    chosen = campaigns[0] if campaigns else None
    data = {
        "campaign": chosen["slug"] if chosen else "",
        "figures_at": max(figure.computed_at for figure in stored.values()).isoformat(),
        "charts": charts_draw(stored, chosen),
    }
    Figure.objects.update_or_create(name=NAME, defaults={"data": data, "computed_at": timezone.now()})
    return NAME
