"""Reads behind the regulator's desk: dashboard figures and curves, the objects of its pages, chip timelines
(the search is ``search_selectors``). Bounded per request. The desk's views read through these only."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from inspections import case_states
from inspections import selectors as inspections
from inspections.claim_explanations import finding_explained
from inspections.models import Alert, AlertAction, Campaign, Claim, Draw, Finding, InspectionTask, Snapshot
from inspections.severity import SEVERITIES, SEVERITY, past_sla_q, sla_deadline
from ledger import keys
from ledger import selectors as ledger
from ledger.admin_tools import EstimatedCountPaginator
from registry.models import Chip, ChipEvent, Facility, Organisation, OrganisationKey, Role
from registry.selectors import organisation_of
from rules import sampling_plans
from rules.inspection_planning import ELIGIBLE, next_draw

from .models import EntrySubject, Figure, Job, KindDay
from .services.figures import figures_refresh

SERIES_KINDS = {"transfers": ("chip.transfer_accepted",), "exports": ("chip.exported",), "shipments": ("chip.shipped",)}
SERIES_DAYS = 90
CURVE_POINTS = 40
DRAW_TASK_ROWS = 500
STORED_OWNER_ABOVE = 100_000


DRAWN_STATUSES = ",".join(ELIGIBLE)  # the chip statuses a draw counts: the campaign rows' chip lists


def figures() -> dict[str, Figure]:
    """The stored aggregates (computed once here on a cold start only)."""
    found = {figure.name: figure for figure in Figure.objects.all()}
    if not found:
        figures_refresh()
        found = {figure.name: figure for figure in Figure.objects.all()}
    return found


def stored_campaign_plans(campaign_pk: int) -> dict[str, dict] | None:
    """Prover slug -> plan of an open campaign, as the beat task last stored it (None if not stored)."""
    stored = Figure.objects.filter(name="open_campaigns").values_list("data", flat=True).first() or []
    return next((c["provers"] for c in stored if c["pk"] == campaign_pk), None)


def charts_stored(stored: dict[str, Figure], chosen: dict | None) -> dict[str, str] | None:
    """The plots the beat task drew (desk.services.charts) if they show these figures and this campaign."""
    drawn = stored.get("dashboard_charts")
    figures_at = max((f.computed_at for name, f in stored.items() if name != "dashboard_charts"), default=None)
    if drawn is None or figures_at is None or drawn.data.get("figures_at") != figures_at.isoformat():
        return None
    return drawn.data["charts"] if drawn.data.get("campaign") == (chosen["slug"] if chosen else "") else None


def series(days: int = SERIES_DAYS) -> dict[str, list[tuple[date, int]]]:
    """Entries per day of each series' kinds over the last ``days`` days (from the counter table)."""
    since = timezone.now().date() - timedelta(days=days)
    wanted = {kind: name for name, kinds in SERIES_KINDS.items() for kind in kinds}
    rows = KindDay.objects.filter(day__gte=since, kind__in=wanted).values_list("day", "kind", "count")
    out: dict[str, dict[date, int]] = {name: defaultdict(int) for name in SERIES_KINDS}
    for day, kind, n in rows:
        out[wanted[kind]][day] += n
    return {name: sorted(points.items()) for name, points in out.items()}


def ledger_state() -> dict:
    checkpoint = ledger.checkpoint_latest()
    sweep = Job.objects.filter(kind=Job.Kind.INTEGRITY_SWEEP).exclude(state__in=["queued", "running"]).first()
    running = Job.objects.filter(kind=Job.Kind.INTEGRITY_SWEEP, state__in=["queued", "running"]).first()
    return {
        "size": ledger.ledger_size(),
        "checkpoint": checkpoint,
        "cosignatures": ledger.checkpoint_cosigners(checkpoint) if checkpoint else [],
        "last_sweep": sweep,
        "running_sweep": running,
    }


def ledger_badge() -> dict:
    """The header's answer to "is the ledger intact?": the last finished sweep and how much of the ledger it
    covered (stale when the ledger grew past it or it is older than two sweep intervals), the latest
    checkpoint's age (stale when entries wait beyond two checkpoint intervals), and its witnesses. Four small
    queries, on every desk page."""
    now = timezone.now()
    size = ledger.ledger_size()
    sweep = (
        Job.objects.filter(kind=Job.Kind.INTEGRITY_SWEEP, state__in=[Job.State.DONE, Job.State.FAILED])
        .only("pk", "state", "result", "finished_at", "message")
        .order_by("-finished_at")
        .first()
    )
    checkpoint = ledger.checkpoint_latest()
    swept = (sweep.result or {}).get("entries") if sweep else None
    sweep_age = (now - sweep.finished_at).total_seconds() if sweep and sweep.finished_at else None
    checkpoint_age = (now - checkpoint.created_at).total_seconds() if checkpoint else None
    return {
        "size": size,
        "sweep": sweep,
        "intact": bool(sweep and (sweep.result or {}).get("intact")),
        "swept": swept,
        "sweep_age": sweep_age,
        "sweep_stale": sweep is None
        or (isinstance(swept, int) and swept < size)
        or (sweep_age is not None and sweep_age > 2 * _beat_seconds("desk-integrity-sweep")),
        "checkpoint": checkpoint,
        "checkpoint_age": checkpoint_age,
        "checkpoint_stale": checkpoint is None
        or (checkpoint.size < size and checkpoint_age > 2 * _beat_seconds("ledger-checkpoint")),
        "witnesses": checkpoint.cosignatures.count() if checkpoint else 0,
    }


def _beat_seconds(entry: str) -> float:
    """How often beat runs ``entry`` (the schedule is the one place the interval is set); a day if not scheduled."""
    schedule = settings.CELERY_BEAT_SCHEDULE.get(entry, {}).get("schedule")
    return schedule.total_seconds() if isinstance(schedule, timedelta) else 86400.0


def inspections_state() -> dict:
    today = timezone.now().date()
    by_status = dict(InspectionTask.objects.values_list("status").annotate(n=Count("id")).order_by())
    overdue = InspectionTask.objects.filter(
        Q(status=InspectionTask.Status.OVERDUE) | Q(status__in=["assigned", "accepted"], due_on__lt=today)
    ).count()
    alerts = defaultdict(lambda: defaultdict(int))
    for kind, state, n in Alert.objects.values_list("kind", "state").annotate(n=Count("id")).order_by():
        alerts[SEVERITY.get(kind, "low")][state] += n
    verdicts = dict(Claim.objects.values_list("result").annotate(n=Count("id")).order_by())
    return {
        "tasks_by_status": by_status,
        "overdue": overdue,
        "alerts": {s: dict(alerts[s]) for s in SEVERITIES},
        "alert_states": [state for state, _ in Alert.State.choices],
        "alert_state_labels": [label for _, label in Alert.State.choices],  # words that wrap: a narrow card fits
        "alerts_past_sla": Alert.objects.filter(past_sla_q(timezone.now())).count(),
        "verdicts": verdicts,
    }


def detection_curves(campaign: dict) -> dict | None:
    """Detection probability against samples per period, paper and exact, for the campaign's largest prover.

    ``campaign`` is one row of the stored ``open_campaigns`` figure. None: no prover of the campaign could run
    the rule's training run (its plan is impossible for each).
    """
    rows = [(slug, row) for slug, row in campaign["provers"].items() if row.get("impossible") is False]
    if not rows:
        return None
    slug, row = max(rows, key=lambda item: item[1]["chips"])
    params = Campaign.objects.get(pk=campaign["pk"])
    planned = {m: row.get(m, {}).get("samples_per_period") for m in ("paper", "exact")}
    top = max([10, *(2 * n for n in planned.values() if n)])
    top = min(top, row["chips"])
    step = max(1, top // CURVE_POINTS)
    curves = {}
    for model, exact in (("paper", False), ("exact", True)):
        points = []
        for samples in range(1, top + 1, step):
            try:
                p = sampling_plans.detection_probability(
                    samples,
                    params.rule_flops,
                    row["chips"],
                    snapshot_rate=params.snapshot_rate,
                    period_days=params.period_days,
                    run_days=params.run_days,
                    flops_per_chip_second=row.get("peak") or sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND,
                    exact=exact,
                )
            except sampling_plans.PlanError:
                break
            points.append((samples, p))
        curves[model] = points
    return {"prover": slug, "chips": row["chips"], "curves": curves, "planned": planned}


def is_inspector(user) -> bool:
    """Whether the user belongs to an inspection body (whose home is the portal)."""
    organisation = organisation_of(user)
    return organisation is not None and organisation.has_role(Role.INSPECTION_BODY)


# --- the objects of the pages (None: no such object) -------------------------------------------------


def chip_of_page(serial: str) -> Chip | None:
    return Chip.objects.select_related("model", "owner", "possessor", "facility").filter(serial=serial).first()


def alert_of_page(pk: int) -> Alert | None:
    return Alert.objects.select_related("prover", "chip", "task").filter(pk=pk).first()


def draw_of_page(pk: int) -> Draw | None:
    return Draw.objects.select_related("campaign").filter(pk=pk).first()


def campaign_of_page(slug: str) -> Campaign | None:
    return Campaign.objects.filter(slug=slug).first()


def task_of_page(pk: int) -> InspectionTask | None:
    return (
        InspectionTask.objects.select_related("chip", "prover", "inspection_body", "draw__campaign")
        .filter(pk=pk)
        .first()
    )


def claim_of_page(pk: int) -> Claim | None:
    return Claim.objects.select_related("prover", "snapshot__chip", "snapshot__log").filter(pk=pk).first()


def job_of_page(pk: int) -> Job | None:
    return Job.objects.filter(pk=pk).first()


def job_about(job: Job) -> dict:
    """What the job works on, in words, with the page that shows it (the params, not a dict)."""
    params = job.params or {}
    if job.kind == Job.Kind.DRAW_AUDIT and "draw" in params:
        return {"text": f"draw #{params['draw']}", "url": ("desk:draw", params["draw"])}
    if job.kind == Job.Kind.CLAIM_REVERIFY and "claim" in params:
        return {"text": f"claim #{params['claim']}", "url": ("desk:claim", params["claim"])}
    return {"text": "the whole ledger" if job.kind == Job.Kind.INTEGRITY_SWEEP else "", "url": None}


JOB_RESULT_LABELS = {
    "intact": "ledger intact",
    "entries": "entries checked",
    "root": "Merkle root",
    "checkpoints": "checkpoints checked",
    "seq": "first faulty entry",
}


def job_result(job: Job) -> list[tuple[str, str]]:
    """The kept result as (label, text) rows, the summary first: readable, not a Python dict."""
    result = job.result if isinstance(job.result, dict) else {}
    rows = []
    for key, value in sorted(result.items(), key=lambda item: item[0] != "summary"):
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, list | tuple):
            text = ", ".join(str(v) for v in value) or "none"
        elif isinstance(value, dict):
            text = "; ".join(f"{k}: {v}" for k, v in value.items()) or "none"
        else:
            text = str(value)
        rows.append((JOB_RESULT_LABELS.get(key, key.replace("_", " ")), text))
    return rows


def alert_detail(alert: Alert, user) -> dict:
    """The alert's severity, its triage actions, oldest first, and the private case text behind their
    commitments where ``user`` may read case files."""
    actions = list(alert.actions.all())
    commitments = [alert.assignee, *(a.reason for a in actions), *(a.assignee for a in actions)]
    claims = []
    if alert.chip_id is not None:  # an alert names its chip, not its claim: the prover's claims about that chip
        claims = list(
            Claim.objects.filter(snapshot__chip_id=alert.chip_id, prover_id=alert.prover_id)
            .select_related("snapshot")
            .order_by("-pk")[:10]
        )
    deadline = sla_deadline(alert.kind, alert.raised_at)
    return {
        "severity": SEVERITY.get(alert.kind, "low"),
        "claims": claims,
        "actions": actions,
        "private": inspections.case_texts(user, commitments),
        "sla_deadline": deadline,
        "past_sla": alert.state in case_states.OPEN and timezone.now() > deadline,
        "next_actions": [a for a in case_states.ACTIONS if alert.state in case_states.TRANSITIONS[a][0]],
        "notifications": list(alert.notifications.order_by("pk")),
    }


def case_texts(user, commitments) -> dict[str, str]:
    """The private text behind each commitment, for a user allowed to read case files; {} for anyone else."""
    return inspections.case_texts(user, commitments)


def draw_tasks(draw: Draw) -> list[InspectionTask]:
    """The draw's tasks by prover and chip (the first ``DRAW_TASK_ROWS``)."""
    tasks = draw.tasks.select_related("chip", "prover", "inspection_body").order_by("prover__slug", "chip__serial")
    return list(tasks[:DRAW_TASK_ROWS])


def campaign_provers(campaign: Campaign) -> list[str]:
    """The slugs of the campaign's named provers; empty: every holder in its country."""
    return list(campaign.provers.order_by("slug").values_list("slug", flat=True))


def campaign_next_draw(campaign: Campaign) -> dict | None:
    """When the campaign draws next: the period and the moment (the day's start, UTC; beat's next run draws a due
    period), or None when it has no period left (ended or stopped)."""
    today = timezone.now().date()
    found = next_draw(campaign, today, set(campaign.draws.values_list("period", flat=True)))
    if found is None:
        return None
    period, day = found
    at = datetime.combine(day, time.min, tzinfo=UTC)
    return {"period": period, "day": day, "at": at, "due": day <= today}


def campaign_versions(campaign: Campaign) -> list[dict]:
    """The ledger entries that made the campaign what it is, oldest first: created, each amendment, a stop; each
    names the entry it supersedes (the ledger is append-only: nothing is edited in place). Followed back from the
    latest through ``supersedes``: one primary-key read per version, no scan of the ledger."""
    entries = []
    seq = next(s for s in (campaign.stopped_seq, campaign.amended_seq, campaign.created_seq) if s is not None)
    while seq is not None and len(entries) < MAX_VERSIONS:
        found = ledger.entries_at([seq])
        if not found:
            break
        entries.append(found[0])
        seq = found[0]["payload"].get("supersedes") if found[0]["kind"] != "campaign.created" else None
    return [
        {
            "seq": entry["seq"],
            "kind": entry["kind"],
            "time": entry["time"],
            "actor": entry["actor"],
            "supersedes": entry["payload"].get("supersedes"),
            "what": _version_words(entry),
        }
        for entry in reversed(entries)
    ]


MAX_VERSIONS = 1000


def _version_words(entry: dict) -> str:
    payload = entry["payload"]
    if entry["kind"] == "campaign.amended":
        params = payload.get("params", {})
        return "amended: " + "; ".join(
            f"{CAMPAIGN_WORDS.get(n, n)} {params.get(n)}" for n in payload.get("changed", [])
        )
    if entry["kind"] == "campaign.stopped":
        return f"stopped: no draw after {payload.get('ends_on')}"
    return "created"


CAMPAIGN_WORDS = {
    "provers": "provers",
    "rule_flops": "rule (H, FLOPs)",
    "detection_probability": "detection target",
    "snapshot_rate": "snapshots per chip per day",
    "model": "sampling model",
    "ends_on": "ends on",
}


# --- organisation page ---------------------------------------------------------------------------

ORG_ROWS = 50
OPEN_ALERT_STATES = tuple(case_states.OPEN)


def organisation_of_page(slug: str) -> Organisation | None:
    return Organisation.objects.select_related("parent").filter(slug=slug).first()


def owner_chip_rows(organisation: Organisation) -> tuple[list, datetime | None]:
    """(facility slug, status, chips) of the organisation's chips, and None: counted now on the (owner,
    status) index. For an owner of more than STORED_OWNER_ABOVE chips (the planner's estimate), the beat
    task's stored rows and their time instead: grouping 300,000 chips took ~0.5 s a request."""
    owned = Chip.objects.filter(owner=organisation)
    if EstimatedCountPaginator(owned.order_by("pk"), 1).count > STORED_OWNER_ABOVE:
        stored = Figure.objects.filter(name="owner_facility_status").first()
        if stored is not None and organisation.slug in stored.data:
            return stored.data[organisation.slug], stored.computed_at
    return list(owned.values_list("facility__slug", "status").annotate(n=Count("id")).order_by()), None


def organisation_story(organisation: Organisation) -> dict:
    """An organisation's story on one page: the chips it owns by facility and status (one grouped query on
    the (owner, status) index), its facilities, open alerts, claims by verdict and the latest, the campaigns
    that target it (and those that did until an amendment dropped it), its keys with their registration and revocation entries, and the latest entries about it."""
    chips: dict[str, dict[str, int]] = defaultdict(dict)
    rows, chips_as_of = owner_chip_rows(organisation)
    for facility, status, n in rows:
        chips[facility or ""][status] = n
    statuses = sorted({status for row in chips.values() for status in row})
    alerts = list(
        Alert.objects.filter(prover=organisation, state__in=OPEN_ALERT_STATES)
        .select_related("chip")
        .order_by("-raised_seq")[:ORG_ROWS]
    )
    verdicts = dict(Claim.objects.filter(prover=organisation).values_list("result").annotate(n=Count("id")).order_by())
    claims = list(Claim.objects.filter(prover=organisation).select_related("snapshot__chip").order_by("-pk")[:10])
    current = Q(provers=organisation) | Q(provers=None, country=organisation.country)
    named = Q(slug__in=campaigns_that_named(organisation))
    campaigns = list(Campaign.objects.filter(current | named).distinct().order_by("-starts_on")[:ORG_ROWS])
    in_force = set(Campaign.objects.filter(current, pk__in=[c.pk for c in campaigns]).values_list("pk", flat=True))
    for campaign in campaigns:
        campaign.former = campaign.pk not in in_force  # named once, dropped by an amendment since
    seqs = EntrySubject.objects.filter(subject=f"org:{organisation.slug}").order_by("-seq")
    recent = [
        {k: e[k] for k in ("seq", "time", "kind", "actor")}
        for e in ledger.entries_at(list(seqs.values_list("seq", flat=True)[:ORG_ROWS]))
    ][::-1]
    return {
        "chips": [
            {"facility": facility, "by_status": [row.get(s, 0) for s in statuses], "total": sum(row.values())}
            for facility, row in sorted(chips.items())
        ],
        "statuses": statuses,
        "chip_total": sum(sum(row.values()) for row in chips.values()),
        "chips_as_of": chips_as_of,
        "facilities": list(Facility.objects.filter(owner=organisation).order_by("slug")),
        "alerts": alerts,
        "verdicts": verdicts,
        "claims": claims,
        "campaigns": campaigns,
        "keys": list(OrganisationKey.objects.filter(organisation=organisation).order_by("registered_seq")),
        "members": list(organisation.members.select_related("user").order_by("user__username")[:ORG_ROWS]),
        "recent": recent,
    }


def campaigns_that_named(organisation: Organisation) -> set[str]:
    """Slugs of the campaigns whose creation or an amendment named the organisation as a prover (the entry index's
    ``org:`` rows): one an amendment dropped it from still belongs to its history."""
    seqs = EntrySubject.objects.filter(
        subject=f"org:{organisation.slug}", kind__in=("campaign.created", "campaign.amended")
    ).values_list("seq", flat=True)
    entries = ledger.entries_at(list(seqs[: ORG_ROWS * 4]))
    return {e["payload"].get("campaign") or e["payload"].get("slug") for e in entries} - {None}


def tasks_by_state(tasks) -> dict[str, int]:
    """Inspection tasks as the dashboard counts them: done, overdue (marked, or past due and not done), open."""
    today = timezone.now().date()
    late = Q(status=InspectionTask.Status.OVERDUE) | Q(status__in=["assigned", "accepted"], due_on__lt=today)
    counts = tasks.aggregate(
        total=Count("id"),
        done=Count("id", filter=Q(status=InspectionTask.Status.DONE)),
        overdue=Count("id", filter=late),
    )
    counts["open"] = counts["total"] - counts["done"] - counts["overdue"]
    return counts


def tasks_by_state_of_campaign(campaign: Campaign) -> dict[str, dict[str, int]]:
    """prover slug -> its inspections in this campaign by state (zeros for a prover never drawn)."""
    today = timezone.now().date()
    late = Q(status=InspectionTask.Status.OVERDUE) | Q(status__in=["assigned", "accepted"], due_on__lt=today)
    rows = (
        InspectionTask.objects.filter(draw__campaign=campaign)
        .values("prover__slug")
        .annotate(
            total=Count("id"),
            done=Count("id", filter=Q(status=InspectionTask.Status.DONE)),
            overdue=Count("id", filter=late),
        )
        .order_by()
    )
    found: dict[str, dict[str, int]] = defaultdict(lambda: {"total": 0, "done": 0, "overdue": 0, "open": 0})
    for row in rows:
        found[row["prover__slug"]] = {
            "total": row["total"],
            "done": row["done"],
            "overdue": row["overdue"],
            "open": row["total"] - row["done"] - row["overdue"],
        }
    return found


def organisation_extract(organisation: Organisation) -> dict:
    """The ledger entries about the organisation (the entry index: made by it or naming it), with their proofs."""
    seqs = (
        EntrySubject.objects.filter(subject=f"org:{organisation.slug}").order_by("-seq").values_list("seq", flat=True)
    )
    return ledger.extract_of(
        {"organisation": organisation.slug}, list(seqs[: ledger.MAX_EXTRACT + 1]), keys.verifier_key()
    )


def campaign_extract(campaign: Campaign) -> dict:
    """The campaign's own entries (created, amendments, a stop, seeds, draws: from its projections), with proofs."""
    seqs = [version["seq"] for version in campaign_versions(campaign)]
    seqs += campaign.seeds.values_list("committed_seq", flat=True)
    seqs += campaign.draws.values_list("drawn_seq", flat=True)
    return ledger.extract_of({"campaign": campaign.slug}, seqs, keys.verifier_key())


def prover_compliance(organisation: Organisation) -> dict:
    """What a prover's compliance report states beyond its story: its inspections by state, alerts by state and
    severity, and per campaign targeting it the plan its draws follow and the detection achieved so far."""
    tasks = InspectionTask.objects.filter(prover=organisation)
    alerts = Alert.objects.filter(prover=organisation).values_list("kind", "state")
    by_state: dict[tuple[str, str], int] = defaultdict(int)
    for kind, state in alerts:
        by_state[(SEVERITY.get(kind, "low"), state)] += 1
    campaigns = []
    for campaign in Campaign.objects.filter(Q(provers=organisation) | Q(provers=None)).distinct().order_by("slug"):
        detail = campaign_detail(campaign)
        if organisation.slug not in detail["plans"] and organisation.slug not in detail["achieved"]:
            continue  # a country campaign that does not target it
        campaigns.append(
            {
                "campaign": campaign,
                "plan": detail["plans"].get(organisation.slug, {}),
                "achieved": detail["achieved"].get(organisation.slug),
                "tasks": tasks_by_state(tasks.filter(draw__campaign=campaign)),
            }
        )
    return {"tasks": tasks_by_state(tasks), "alerts": dict(sorted(by_state.items())), "campaigns": campaigns}


# --- chip page ------------------------------------------------------------------------------------


TASK_ENTRY_KINDS = ("inspection.accepted", "inspection.identity_checked", "inspection.snapshot_log")


def chip_timeline(chip: Chip) -> list[dict]:
    """Every ledger entry about the chip, oldest first: its own events (shipments, transfers...), the draws that
    picked it, its inspections (accepted, identity checks, snapshot logs, findings), claims about its snapshots
    and their verdicts, alerts about it and their triage."""
    seqs = set(ChipEvent.objects.filter(chip=chip).values_list("seq", flat=True))
    tasks = list(InspectionTask.objects.filter(chip=chip).select_related("draw", "finding"))
    seqs.update(task.assigned_seq for task in tasks)
    seqs.update(task.finding.recorded_seq for task in tasks if hasattr(task, "finding"))
    seqs.update(Alert.objects.filter(chip=chip).values_list("raised_seq", flat=True))
    seqs.update(AlertAction.objects.filter(alert__chip=chip).values_list("seq", flat=True))
    task_pks = [task.pk for task in tasks]
    if task_pks:  # the inspection's own entries: accepted, identity checked, snapshot logs (the entry index)
        for kind in TASK_ENTRY_KINDS:
            seqs.update(_task_entry_seqs(task_pks, kind))
    for claimed, verdict in Claim.objects.filter(snapshot__chip=chip).values_list("claimed_seq", "result_seq"):
        seqs.update(seq for seq in (claimed, verdict) if seq is not None)
    facilities = {}
    rows = []
    for entry in ledger.entries_at(sorted(seqs)):
        rows.append({**entry, **_about(chip.serial, entry["kind"], entry["payload"])})
        if rows[-1].get("facility"):
            facilities[rows[-1]["facility"]] = None
    places = {f.slug: f for f in Facility.objects.filter(slug__in=facilities)}
    for row in rows:
        place = places.get(row.get("facility") or "")
        row["place"] = place.location if place else ""
        # The place (and a country the entry does not name) come from the facility's own registration entry:
        # the in-browser check verifies them against that entry's leaf.
        row["place_seq"] = place.registered_seq if place else ""
        row["country_from_place"] = not row.get("country") and bool(place)
        row["country"] = row.get("country") or (place.country if place else "")
        row.pop("payload", None)  # bulk entries list thousands of chips: keep only this chip's part
    return rows


def _about(serial: str, kind: str, payload: dict) -> dict:
    """This chip's counterparty, facility and country in an entry's payload."""
    item = payload
    if kind == "chip.fabricated":
        item = next((c for c in payload.get("chips", []) if c.get("serial") == serial), {})
    counterparty = payload.get("consignee") or payload.get("to_owner") or payload.get("prover") or ""
    country = payload.get("country") or payload.get("destination_country") or ""
    return {"counterparty": counterparty, "facility": item.get("facility") or "", "country": country}


# --- search ---------------------------------------------------------------------------------------


def draw_detail(draw: Draw) -> dict:
    """What the draw's ledger entries say: commitment, checkpoint, revealed seed, drawn chips per prover."""
    drawn = ledger.entries_at([draw.drawn_seq])
    payload = drawn[0]["payload"] if drawn else {}
    commitments = EntrySubject.objects.filter(subject=f"campaign:{draw.campaign.slug}", kind="campaign.seed_committed")
    committed = next(
        (
            e
            for e in ledger.entries_at(commitments.values_list("seq", flat=True))
            if e["payload"].get("period") == draw.period
        ),
        None,
    )
    return {
        "commitment": committed["payload"]["commitment"] if committed else "",
        "committed_seq": committed["seq"] if committed else None,
        "seed": payload.get("seed", ""),
        "checkpoint": payload.get("checkpoint", {}),
        "provers": payload.get("provers", {}),
        "jobs": Job.objects.filter(kind=Job.Kind.DRAW_AUDIT, params__draw=draw.pk)[:5],
    }


# --- campaign, task and claim pages ---------------------------------------------------------------


def campaign_detail(campaign: Campaign) -> dict:
    """Plan per prover (the stored figure when it has this campaign, else computed now), chips covered, tasks
    by state, the detection probability its draws achieved so far, and its draws."""
    stored = Figure.objects.filter(name="open_campaigns").first()
    found = next((c for c in (stored.data if stored else []) if c["pk"] == campaign.pk), None)
    if found is not None:
        plans, plans_at = found["provers"], stored.computed_at
    else:
        peaks = {prover.slug: peak for prover, _, peak in inspections.campaign_targets(campaign)}
        plans = {slug: {**row, "peak": peaks[slug]} for slug, row in inspections.campaign_plan(campaign).items()}
        plans_at = timezone.now()
    draws = list(campaign.draws.order_by("period"))
    tasks = InspectionTask.objects.filter(draw__campaign=campaign)
    today = timezone.now().date()
    late = Q(status=InspectionTask.Status.OVERDUE) | Q(status__in=["assigned", "accepted"], due_on__lt=today)
    counts = tasks.aggregate(
        total=Count("id"),
        done=Count("id", filter=Q(status=InspectionTask.Status.DONE)),
        overdue=Count("id", filter=late),
        chips=Count("chip", distinct=True),
    )
    counts["open"] = counts["total"] - counts["done"] - counts["overdue"]
    samples = {draw.drawn_seq: entry["payload"].get("provers", {}) for draw, entry in _drawn_entries(draws)}
    achieved = achieved_detection(campaign, plans, [samples.get(draw.drawn_seq, {}) for draw in draws])
    per_draw = dict(tasks.values_list("draw").annotate(n=Count("id")).order_by())
    return {
        "plans": plans,
        "plans_at": plans_at,
        "tasks": counts,
        "achieved": achieved,
        "draws": [{"draw": draw, "tasks": per_draw.get(draw.pk, 0)} for draw in draws],
    }


def _drawn_entries(draws: list[Draw]):
    by_seq = {entry["seq"]: entry for entry in ledger.entries_at([draw.drawn_seq for draw in draws])}
    return [(draw, by_seq[draw.drawn_seq]) for draw in draws if draw.drawn_seq in by_seq]


def achieved_detection(campaign: Campaign, plans: dict, drawn: list[dict]) -> dict[str, float | None]:
    """prover -> probability that a violating run over the drawn periods was caught by the samples drawn.

    Each period drawn caught the run with ``d = 1 − P_miss(s)``: the sample of ``s`` chips it drew without
    replacement from the ``C`` the prover held then (as the ledger's ``campaign.drawn`` states them), ``K`` of
    which the run uses, each logging in the period with probability ``1 − e^(−f·T_m)``
    (``sampling_plans.period_detection_probability``). Periods miss independently: ``1 − Π(1 − d)``. None: the run
    is impossible for the prover (or its plan failed) in every period drawn.
    """
    out = {}
    for slug in sorted({s for sample in drawn for s in sample} | set(plans)):
        log_miss, any_period = 0.0, False
        for sample in drawn:
            row = sample.get(slug)
            if not row or not row.get("chips") or row.get("plan_error"):
                continue
            try:
                caught = sampling_plans.period_detection_probability(
                    len(row.get("drawn", [])),
                    campaign.rule_flops,
                    row["chips"],
                    snapshot_rate=campaign.snapshot_rate,
                    period_days=campaign.period_days,
                    run_days=campaign.run_days,
                    flops_per_chip_second=plans.get(slug, {}).get("peak")
                    or sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND,
                )
            except sampling_plans.PlanError:
                continue  # impossible for this prover then: nothing to catch
            any_period = True
            log_miss += math.log1p(-caught) if caught < 1 else -math.inf
        out[slug] = 0.0 - math.expm1(log_miss) if any_period else None
    return out


def task_detail(task: InspectionTask) -> dict:
    """Identity results (the ledger's ``inspection.identity_checked``), log verdicts, snapshots, finding, alerts."""
    identity = [
        {k: e[k] for k in ("seq", "time", "actor")}
        | {"passed": e["payload"].get("passed"), "reason": e["payload"].get("reason")}
        for e in ledger.entries_at(_task_entry_seqs([task.pk], "inspection.identity_checked"))
    ]
    logs = list(
        task.snapshot_logs.order_by("uploaded_at").only(
            "sha256", "status", "problems", "checked_seq", "uploaded_at", "task_id"
        )[:TASK_ROWS]
    )
    snapshots = list(Snapshot.objects.filter(log__task=task).select_related("claim").order_by("counter")[:TASK_ROWS])
    return {
        "identity": identity,
        "logs": logs,
        "snapshots": snapshots,
        "finding": Finding.objects.filter(task=task).first(),
        "alerts": list(Alert.objects.filter(task=task).order_by("raised_seq")),
    }


TASK_ROWS = 200


def _task_entry_seqs(task_pks: list[int], kind: str) -> list[int]:
    """The first TASK_ROWS seqs of ``kind`` entries about these tasks, from the desk's entry index."""
    subjects = [f"task:{pk}" for pk in task_pks]
    rows = EntrySubject.objects.filter(subject__in=subjects, kind=kind).order_by("seq")
    return list(rows.values_list("seq", flat=True)[:TASK_ROWS])


def claim_detail(claim: Claim) -> dict:
    """The claim's verdict and reasons, its run's coverage, and the re-verifications started from the desk."""
    report = claim.report if isinstance(claim.report, dict) else {}
    return {
        "report": report,
        "reasons": [str(r) for r in report.get("reasons") or []] or [r for r in [report.get("error")] if r],
        "segments_replayed": len(report.get("segments_replayed") or []),
        "segments_total": report.get("segments_total"),
        "coverage": inspections.run_coverage(claim.prover, claim.manifest),
        "location": _without_secrets(claim.location),
        "jobs": Job.objects.filter(kind=Job.Kind.CLAIM_REVERIFY, params__claim=claim.pk)[:10],
        "dispute": report.get("dispute") if isinstance(report.get("dispute"), dict) else None,
        "findings": [
            f | {"meaning": finding_explained(f)} for f in report.get("findings") or [] if isinstance(f, dict)
        ],
        "conflicts": [c for c in report.get("conflicts") or [] if isinstance(c, dict)],
        "nonce": claim.nonce,
    }


def _without_secrets(location: str) -> str:
    """A transcript URL may carry credentials (user:password@, a signed query): show scheme, host and path."""
    parts = urlsplit(location)
    if not parts.scheme:
        return location
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: leave it out
        port = ""
    return urlunsplit((parts.scheme, (parts.hostname or "") + port, parts.path, "", ""))
