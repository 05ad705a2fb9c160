"""Compliance reports for a prover or a campaign, as CSV and PDF: one ``Report`` read through the selectors,
written either way. Everything in them is plain text in words (no field names, no HTML); the PDF is drawn by
fpdf2 with the DejaVu Sans font matplotlib ships (any name in any script prints)."""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
from django.utils import timezone

from inspections.models import Campaign
from ledger import selectors as ledger
from registry.models import Organisation
from rules.countries import country_name
from rules.units import flops

from . import selectors
from .exports import csv_cell, export_filename

FONT_DIR = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
logging.getLogger("fontTools").setLevel(logging.WARNING)  # the font subsetter logs every glyph at INFO


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Report:
    kind: str  # "prover" or "campaign": the file name's first word after "compliance"
    subject: str  # the slug
    title: str
    facts: list[tuple[str, str]]
    sections: list[Section] = field(default_factory=list)

    def filename(self, extension: str) -> str:
        return export_filename(f"compliance-{self.kind}-{self.subject}", extension)


def _ledger_facts() -> list[tuple[str, str]]:
    checkpoint = ledger.checkpoint_latest()
    now = timezone.localtime()
    facts = [("generated", now.strftime("%Y-%m-%d %H:%M %Z")), ("ledger size", f"{ledger.ledger_size():,} entries")]
    if checkpoint is not None:
        facts.append(("latest signed checkpoint", f"size {checkpoint.size:,}, root {bytes(checkpoint.root).hex()}"))
    return facts


def _probability(value) -> str:
    return "-" if value is None or value == "" else f"{value:.3f}"


def _plan_words(row: dict) -> str:
    if not row:
        return "-"
    if row.get("impossible", True):
        needed = row.get("chips_needed")
        return f"the run is impossible here: it needs {needed if needed is not None else 'more'} chips"
    chosen = row.get(row.get("model") or "paper", {})
    return chosen.get("error") or chosen.get("words") or "-"


def _tasks(counts: dict) -> list[str]:
    return [str(counts["total"]), str(counts["done"]), str(counts["overdue"]), str(counts["open"])]


TASK_COLUMNS = ["inspections drawn", "done", "overdue", "open"]


def _runs(campaign: Campaign) -> str:
    if campaign.ends_on is not None and campaign.ends_on < campaign.starts_on:
        return f"never: stopped before its start on {campaign.starts_on.isoformat()}"
    ends = campaign.ends_on.isoformat() if campaign.ends_on else "until stopped"
    return f"{campaign.starts_on.isoformat()} – {ends}"


# --- what each report says ---------------------------------------------------------------------


def prover_report(organisation: Organisation) -> Report:
    story = selectors.organisation_story(organisation)
    compliance = selectors.prover_compliance(organisation)
    roles = ", ".join(str(role).replace("_", " ") for role in organisation.roles or []) or "-"
    facts = [
        ("organisation", f"{organisation.legal_name} ({organisation.slug})"),
        ("country", f"{organisation.country} — {country_name(organisation.country)}" if organisation.country else "-"),
        ("roles", roles),
        ("chips owned", f"{story['chip_total']:,}"),
        *_ledger_facts(),
    ]
    chips = Section(
        "Chips owned, by facility and status",
        ["facility", *story["statuses"], "total"],
        [[r["facility"] or "(no facility)", *map(str, r["by_status"]), str(r["total"])] for r in story["chips"]],
    )
    tasks = Section("Inspections", TASK_COLUMNS, [_tasks(compliance["tasks"])])
    campaigns = Section(
        "Campaigns targeting it",
        ["campaign", "rule (H)", "detection target", "plan its draws follow", "achieved so far", *TASK_COLUMNS],
        [
            [
                row["campaign"].slug,
                flops(row["campaign"].rule_flops),
                _probability(row["campaign"].detection_probability),
                _plan_words(row["plan"]),
                _probability(row["achieved"]),
                *_tasks(row["tasks"]),
            ]
            for row in compliance["campaigns"]
        ],
        "Achieved so far: the probability that the draws made so far caught a violating run (docs/regulator.md).",
    )
    alerts = Section(
        "Alerts",
        ["severity", "state", "alerts"],
        [[sev, state, str(n)] for (sev, state), n in compliance["alerts"].items()],
    )
    claims = Section(
        "Claims by verdict", ["verdict", "claims"], [[v, str(n)] for v, n in sorted(story["verdicts"].items())]
    )
    return Report(
        "prover",
        organisation.slug,
        f"Compliance report: {organisation.legal_name}",
        facts,
        [chips, tasks, campaigns, alerts, claims],
    )


def campaign_report(campaign: Campaign) -> Report:
    detail = selectors.campaign_detail(campaign)
    provers = ", ".join(selectors.campaign_provers(campaign)) or f"every owner/operator in {campaign.country}"
    next_draw = selectors.campaign_next_draw(campaign)
    facts = [
        ("campaign", campaign.slug),
        ("provers", provers),
        ("rule (H)", flops(campaign.rule_flops)),
        ("detection target", _probability(campaign.detection_probability)),
        ("sampling model", campaign.get_model_display()),
        (
            "period",
            f"{campaign.period_days} days; run {campaign.run_days} days; {campaign.snapshot_rate} snapshots/chip/day",
        ),
        ("runs", _runs(campaign)),
        (
            "state",
            "stopped"
            if campaign.stopped_seq is not None
            else "amended"
            if campaign.amended_seq is not None
            else "as created",
        ),
        ("next draw", f"period {next_draw['period']} on {next_draw['day'].isoformat()}" if next_draw else "none"),
        *_ledger_facts(),
    ]
    tasks = selectors.tasks_by_state_of_campaign(campaign)
    plans = Section(
        "Provers",
        ["prover", "eligible chips", "plan its draws follow", "achieved so far", *TASK_COLUMNS],
        [
            [
                slug,
                f"{row.get('chips', 0):,}",
                _plan_words(row),
                _probability(detail["achieved"].get(slug)),
                *_tasks(tasks[slug]),
            ]
            for slug, row in detail["plans"].items()
        ],
    )
    draws = Section(
        "Draws",
        ["period", "drawn at", "checkpoint size", "inspections"],
        [
            [
                str(row["draw"].period),
                timezone.localtime(row["draw"].drawn_at).strftime("%Y-%m-%d %H:%M %Z"),
                str(row["draw"].checkpoint_size),
                str(row["tasks"]),
            ]
            for row in detail["draws"]
        ],
    )
    history = Section(
        "History on the ledger",
        ["entry", "kind", "what", "supersedes"],
        [
            [f"#{v['seq']}", v["kind"], v["what"], "-" if v["supersedes"] is None else f"#{v['supersedes']}"]
            for v in selectors.campaign_versions(campaign)
        ],
    )
    return Report(
        "campaign", campaign.slug, f"Compliance report: campaign {campaign.slug}", facts, [plans, draws, history]
    )


# --- writing it ------------------------------------------------------------------------------------


def report_csv(report: Report) -> str:
    """The report as CSV: its facts as label/value rows, then each section (title, header, rows, a blank line)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["report", csv_cell(report.title)])
    writer.writerows([csv_cell(label), csv_cell(value)] for label, value in report.facts)
    for section in report.sections:
        writer.writerow([])
        writer.writerow([csv_cell(section.title)])
        writer.writerow([csv_cell(c) for c in section.columns])
        writer.writerows([csv_cell(cell) for cell in row] for row in section.rows)
        if section.note:
            writer.writerow([csv_cell(section.note)])
    return out.getvalue()


def report_pdf(report: Report) -> bytes:
    """The report as an A4 PDF: title, facts, one table per section."""
    from fpdf import FPDF  # fpdf2: only the PDF download needs it (the desk works on without it)
    from fpdf.fonts import FontFace

    pdf = FPDF(orientation="landscape", format="A4")
    pdf.set_title(report.title)
    pdf.set_author("chipledger · regulator's desk")
    pdf.add_font("DejaVu", "", str(FONT_DIR / "DejaVuSans.ttf"))
    pdf.add_font("DejaVu", "B", str(FONT_DIR / "DejaVuSans-Bold.ttf"))
    pdf.set_auto_page_break(True, margin=12)
    pdf.add_page()
    pdf.set_font("DejaVu", "B", 15)
    pdf.multi_cell(0, 8, report.title, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)
    pdf.set_font("DejaVu", "", 9)
    with pdf.table(col_widths=(45, 230), first_row_as_headings=False, text_align="LEFT") as table:
        for label, value in report.facts:
            row = table.row()
            row.cell(label, style=FontFace(emphasis="BOLD"))
            row.cell(value)
    for section in report.sections:
        pdf.ln(4)
        pdf.set_font("DejaVu", "B", 11)
        pdf.multi_cell(0, 6, section.title, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("DejaVu", "", 8)
        if not section.rows:
            pdf.multi_cell(0, 5, "none", new_x="LMARGIN", new_y="NEXT")
            continue
        with pdf.table(
            text_align="LEFT", headings_style=FontFace(emphasis="BOLD", fill_color=(230, 235, 240))
        ) as table:
            table.row(section.columns)
            for cells in section.rows:
                table.row(cells)
        if section.note:
            pdf.multi_cell(0, 5, section.note, new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())
