"""Reads of the inspections app: inspectors see only their own body's tasks; campaigns' targets and plans."""

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet
from django.utils import timezone

from registry.models import Chip, Organisation, Role
from registry.selectors import chip_owner_at
from rules.inspection_planning import ELIGIBLE, OWNERS_ONLY, counts_as_prover, prover_plan

from .models import Campaign, CaseText, Claim, CoverageReverification, InspectionTask, Snapshot, SnapshotLog
from .verification import MAX_DRAWS, run_coverage_share


def case_texts(user, commitments) -> dict[str, str]:
    """The private text behind each commitment, for a user allowed to read case files; {} for anyone else."""
    wanted = {c for c in commitments if c}
    if not wanted or not user.has_perm("inspections.view_casetext"):
        return {}
    return dict(CaseText.objects.filter(commitment__in=wanted).values_list("commitment", "text"))


def tasks_of(body: Organisation) -> QuerySet[InspectionTask]:
    return (
        InspectionTask.objects.filter(inspection_body=body)
        .select_related("chip__facility", "prover", "draw__campaign")
        .order_by("due_on", "id")
    )


def task_of(body: Organisation, task_id: int) -> InspectionTask | None:
    return tasks_of(body).filter(pk=task_id).first()


def snapshot_log_of(body: Organisation, log_id: int) -> SnapshotLog | None:
    return SnapshotLog.objects.filter(pk=log_id, task__inspection_body=body).first()


def claim_of(organisation: Organisation | None, claim_id: int) -> Claim | None:
    """The prover sees its own claims and the regulator all; an inspection body only the claims answering the
    snapshots it read (its own tasks' logs): a verdict's report is no other body's business."""
    if organisation is None:
        return None
    claims = Claim.objects.filter(pk=claim_id)
    if organisation.has_role(Role.REGULATOR):
        return claims.first()
    mine = Q(prover=organisation)
    if organisation.has_role(Role.INSPECTION_BODY):
        mine |= Q(snapshot__log__task__inspection_body=organisation)
    return claims.filter(mine).first()


def campaign_targets(campaign: Campaign) -> list[tuple[Organisation, int, float | None]]:
    """The campaign's provers with their eligible chip counts and fastest model, in one grouped scan."""
    provers = [] if campaign.country else list(campaign.provers.all())
    return targets_of(campaign.country, provers, campaign.holders == OWNERS_ONLY)


def targets_of(
    country: str, provers: list[Organisation], owners_only: bool = False
) -> list[tuple[Organisation, int, float | None]]:
    """Provers (named, or every owner of eligible chips in ``country``) with their eligible chip counts and
    fastest model.

    A country campaign targets every owner of eligible chips located there (a country may
    hold 10^7 chips: one pass over them, not one per prover); the plan counts all the prover's chips.
    ``owners_only``: only holders registered as owners/operators (a vendor's warehouse stock is no prover's).
    """
    eligible = Chip.objects.filter(status__in=ELIGIBLE)
    if country:
        rows = (
            eligible.values("owner")
            .annotate(
                count=Count("id"),
                peak=Max("model__peak_flops_16bit"),
                here=Count("id", filter=Q(country=country)),
            )
            .filter(here__gt=0)
        )
        provers = list(Organisation.objects.filter(pk__in=[row["owner"] for row in rows]).order_by("slug"))
        if owners_only:
            provers = [prover for prover in provers if counts_as_prover({"holders": OWNERS_ONLY}, prover.roles)]
    else:
        provers = sorted(provers, key=lambda prover: prover.slug)
        rows = (
            eligible.filter(owner__in=provers)
            .values("owner")
            .annotate(count=Count("id"), peak=Max("model__peak_flops_16bit"))
        )
    found = {row["owner"]: row for row in rows}
    return [
        (prover, found.get(prover.pk, {}).get("count", 0), found.get(prover.pk, {}).get("peak")) for prover in provers
    ]


def prover_candidates() -> QuerySet[Organisation]:
    """Organisations a campaign can name as provers: owners/operators holding chips a draw would count."""
    holds = Exists(Chip.objects.filter(owner=OuterRef("pk"), status__in=ELIGIBLE))
    owners = [org.pk for org in Organisation.objects.only("pk", "roles") if org.has_role(Role.OWNER)]
    return Organisation.objects.filter(holds, pk__in=owners).order_by("slug")


def campaign_preview(params: dict) -> dict[str, dict]:
    """prover slug -> both plans for a campaign not yet created (``services.campaigns.campaign_clean``'s
    payload): what creating it would ask of each prover today. Reads only."""
    campaign = Campaign(**{k: v for k, v in params.items() if k in PLAN_FIELDS})
    provers = list(Organisation.objects.filter(slug__in=params["provers"]))
    return {
        prover.slug: prover_plan(campaign, count, peak)
        for prover, count, peak in targets_of(campaign.country, provers, params.get("holders") == OWNERS_ONLY)
    }


PLAN_FIELDS = (
    "slug",
    "country",
    "rule_flops",
    "detection_probability",
    "snapshot_rate",
    "period_days",
    "run_days",
    "model",
)


def campaign_plan(campaign: Campaign) -> dict[str, dict]:
    """prover slug -> both plans (paper and exact) for its chips today, and what the campaign's model draws."""
    return {prover.slug: prover_plan(campaign, count, peak) for prover, count, peak in campaign_targets(campaign)}


def snapshot_owner(snapshot: Snapshot) -> str:
    """The slug of who answers a logged snapshot: the chip's owner at the snapshot's signed time (the registry
    as it was then), not today's: the seller answers for the training it did before a sale, the buyer never.
    (``registry.selectors.chip_owner_at`` holds a chip's clock within the ledger's knowledge of it.)"""
    signed_at = datetime.fromisoformat(snapshot.time.replace("Z", "+00:00"))  # the checker admitted RFC 3339 UTC
    return chip_owner_at(snapshot.chip, signed_at, snapshot.log.checked_seq)


def rule_flops_for_chip(chip: Chip) -> float:
    """The strictest rule of any campaign that drew this chip (what a claim for it is checked against)."""
    rules = Campaign.objects.filter(draws__tasks__chip=chip).values_list("rule_flops", flat=True)
    return min(rules, default=float("inf"))


# --- what a claim's verification is told (the verifier contract's claims file, docs/claims.md) ------

MAX_HISTORY = 1000  # a chip's earlier claims passed to the verifier (latest first)
# results of a replay that ran (its report counted the run's figures from the committed manifest)
REPLAYED_RESULTS = (Claim.Result.VERIFIED, Claim.Result.MISMATCH, Claim.Result.RULE_VIOLATED)


def claim_request(claim: Claim, *, own_covered: bool = False) -> dict:
    """The verifier's claims file for one claim: the snapshot with its logged time, the chip's earlier
    claims, the chips the registry says the prover holds, and the run's coverage so far (from the ledger's
    ``claim.verified`` and ``claim.reverified`` entries, through their projections). ``own_covered``: a coverage
    re-verification, which counts the claim's own replayed segments as covered so that it draws fresh ones."""
    snapshot = claim.snapshot
    replays = _run_replays(claim.prover, claim.manifest, None if own_covered else claim.pk)
    return {
        "manifest": claim.manifest,
        "claims": [
            {
                "serial": snapshot.chip.serial,
                "counter": snapshot.counter,
                "shard": snapshot.shard,
                "hash": snapshot.hash,
                "step": claim.step,
                "time": snapshot.time,
                **work_counters(snapshot.work),
            }
        ],
        "history": {snapshot.chip.serial: chip_claim_history(claim)},
        "prover_chips": prover_chips(claim.prover),
        "run_snapshots": run_snapshot_times(claim.prover, claim.manifest),
        "replayed_segments": sorted(replays.replayed),
        "earlier_draws": [list(d) for d in informative(replays.draws)],
        "pending_segments": sorted(replays.pending),
        "coverage_target": settings.REPLAY_COVERAGE_TARGET,
    }


def chip_claim_history(claim: Claim) -> list[dict]:
    """The chip's other claims (any run, any counter, filed before or after this one), oldest first: order and
    overlap are checked against all of them, whatever order they were filed and answered in (the latest 1000
    around this snapshot: the nearest counters first). Each carries its run's length and the FLOPs a step of
    that run costs this chip, as our verifier counted them from the run's manifest when it replayed one of the
    chip's claims of that run (absent until then): the work between two runs' snapshots is accounted with them."""
    serial = claim.snapshot.chip.serial
    earlier = (
        Claim.objects.filter(snapshot__chip=claim.snapshot.chip_id)
        .exclude(pk=claim.pk)
        .order_by("-snapshot__counter")
        .values("snapshot__counter", "snapshot__time", "snapshot__work", "step", "run", "manifest", "result", "report")[
            :MAX_HISTORY
        ]
    )
    rows = list(reversed(earlier))
    figures = run_figures(serial, rows)
    return [
        {
            "counter": c["snapshot__counter"],
            "time": c["snapshot__time"],
            "step": c["step"],
            "run": c["run"],
            "manifest": c["manifest"],
            **work_counters(c["snapshot__work"]),
            **figures.get(c["manifest"], {}),
        }
        for c in rows
    ]


def run_figures(serial: str, rows: list[dict]) -> dict[str, dict]:
    """manifest -> {run_steps, chip_step_flops} from the reports of the chip's replayed claims (our verifier's
    count from the committed manifest, on the ledger in ``claim.verified``; never the prover's word)."""
    out: dict[str, dict] = {}
    for c in rows:
        report = c["report"] if isinstance(c["report"], dict) else {}
        steps, flops = report.get("steps"), (report.get("chip_step_flops") or {}).get(serial)
        if c["result"] in REPLAYED_RESULTS and type(steps) is int and type(flops) in (int, float):
            out.setdefault(c["manifest"], {"run_steps": steps, "chip_step_flops": flops})
    return out


def work_counters(work) -> dict:
    """The snapshot's signed firmware work counters as the verifier reads them ({} when the firmware counts none)."""
    if not isinstance(work, dict) or not {"busy_ns", "flops"} <= set(work):
        return {}
    return {"busy_ns": int(work["busy_ns"]), "flops": int(work["flops"])}


def prover_chips(prover: Organisation) -> dict[str, dict]:
    """serial -> model and peak 16-bit FLOP/s of every chip the registry says the prover held at the time of its
    runs: the chips it holds now, and every chip whose logged snapshots it answered (a claim is accepted only
    from the chip's owner), so a chip sold or decommissioned after the run still counts as the prover's then."""
    held = Chip.objects.filter(owner=prover, status__in=ELIGIBLE)
    answered = Chip.objects.filter(snapshots__claim__prover=prover)
    rows = (held | answered).distinct().values_list("serial", "model__slug", "model__peak_flops_16bit")
    return {
        serial: {"model": model, "peak_flops_16bit": peak} for serial, model, peak in rows.iterator(chunk_size=10000)
    }


def run_snapshot_times(prover: Organisation, manifest: str) -> dict[str, list[str]]:
    """serial -> times of the run's answered snapshots on every chip (the latest 1000 per run): which chips
    demonstrably worked on the run, and when (the pace counts only those)."""
    rows = (
        Claim.objects.filter(prover=prover, manifest=manifest)
        .order_by("-snapshot__time")
        .values_list("snapshot__chip__serial", "snapshot__time")[:MAX_HISTORY]
    )
    out: dict[str, list[str]] = {}
    for serial, time in rows:
        out.setdefault(serial, []).append(time)
    return out


# --- coverage per run (a run is the prover's transcript: prover and manifest hash) ---------------


def run_claims(prover: Organisation, manifest: str) -> QuerySet[Claim]:
    return Claim.objects.filter(prover=prover, manifest=manifest)


@dataclass(frozen=True)
class RunReplays:
    """What the run's verified verifications (claims and re-verifications) replayed and drew, from their reports."""

    replayed: set[int]  # every segment replayed (forced or drawn)
    drawn: set[int]  # those a random draw chose
    draws: list[tuple[int, int]]  # (pool, drawn) of each verification that drew (inspections.verification)
    cut: set[int]  # draws a budget cut while they were replayed

    @property
    def pending(self) -> set[int]:
        """Cut draws no verification has replayed since: the next one replays them first."""
        return self.cut - self.replayed


def _run_replays(prover: Organisation, manifest: str, exclude: int | None) -> RunReplays:
    verified = run_claims(prover, manifest).filter(result=Claim.Result.VERIFIED).exclude(pk=exclude)
    again = CoverageReverification.objects.filter(claim__in=verified, result=Claim.Result.VERIFIED).values_list(
        "report", flat=True
    )
    out = RunReplays(set(), set(), [], set())
    for report in [*verified.values_list("report", flat=True), *again]:
        these = {s for s in report.get("segments_replayed") or [] if type(s) is int}
        chosen = {s for s in report.get("segments_drawn") or [] if type(s) is int and s in these}
        out.replayed.update(these)
        out.drawn.update(chosen)
        pool, cut = report.get("draw_pool"), report.get("draw_cut")
        if type(pool) is int and 0 < len(chosen) <= pool:  # reports from before pools were kept draw nothing
            out.draws.append((pool, len(chosen)))
        if type(cut) is int:
            out.cut.add(cut)
    return out


# Outcomes of a claim's verification whose draws count for nothing although they may have drawn a fabricated
# segment (a mismatch, a segment whose material does not parse, a verifier that failed on it every retry): a
# run with one is disputed. Its target is not met and the beat leaves it to the regulator, or a prover could
# file claims until the draws passed its fabrication by. (timed_out: legacy verdicts, before draws were kept.)
UNCOUNTED_DRAWS = (
    Claim.Result.MISMATCH,
    Claim.Result.RULE_VIOLATED,
    Claim.Result.MALFORMED,
    Claim.Result.UNAVAILABLE,
    Claim.Result.ERROR,
)


def informative(draws: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """At most MAX_DRAWS of the run's (pool, drawn) pairs, those that lower the miss probability most: a pair
    left out only raises it (the safe side), and a longer list would make an honest claim malformed."""
    if len(draws) <= MAX_DRAWS:
        return draws
    return sorted(draws, key=lambda d: d[1] / d[0], reverse=True)[:MAX_DRAWS]


def run_coverage(prover: Organisation, manifest: str) -> dict:
    """Which of the run's segments have been replayed, and the probability that one fabricated segment placed
    where no claim forced a replay would have been caught: 1 - the product over the run's verified
    verifications of (pool - drawn) / pool (replay/protocol/coverage.py). Reports that kept no pool draw nothing.
    The target is met only with no cut draw pending."""
    claims = list(
        run_claims(prover, manifest).order_by("claimed_seq").values("run", "result", "report", "coverage_stalled_at")
    )
    replays = _run_replays(prover, manifest, None)
    totals = [c["report"].get("segments_total") for c in claims if c["result"] == Claim.Result.VERIFIED]
    total = max((t for t in totals if type(t) is int and t > 0), default=0)
    reported = [c["report"].get("coverage") for c in claims if c["result"] == Claim.Result.VERIFIED]
    never = max(total - len(replays.replayed), 0)
    caught = run_coverage_share(replays.draws, never) if total else 0.0
    pending = sorted(replays.pending)
    again = CoverageReverification.objects.filter(claim__prover=prover, claim__manifest=manifest).aggregate(
        count=Count("pk"), disputed=Count("pk", filter=~Q(result=Claim.Result.VERIFIED))
    )
    disputed = again["disputed"] + sum(1 for c in claims if c["result"] in UNCOUNTED_DRAWS)
    stalled = max((c["coverage_stalled_at"] for c in claims if c["coverage_stalled_at"]), default=None)
    return {
        "prover": prover.slug,
        "manifest": manifest,
        "names": sorted({c["run"] for c in claims}),
        "claims": len(claims),
        "results": dict(sorted(Counter(c["result"] for c in claims).items())),
        "segments_total": total,
        "segments_replayed": sorted(replays.replayed),
        "segments_drawn": sorted(replays.drawn),
        "segments_pending": pending,
        "draws": len(replays.draws),
        "coverage": caught,
        # the latest verified claim's own figure (the run's coverage as that verification saw it)
        "verifier_coverage": next((r for r in reversed(reported) if isinstance(r, (int, float))), None),
        "target": settings.REPLAY_COVERAGE_TARGET,
        # verifications that did not verify (claims or re-verifications): the regulator decides, no more coverage work
        "disputed": disputed,
        "target_met": bool(total) and caught >= settings.REPLAY_COVERAGE_TARGET and not pending and not disputed,
        "reverifications": again["count"],
        # re-verifications made no progress (the claims' own replays fill the budget, or ours failed): once a day
        "stalled_since": stalled,
    }


def coverage_reverifications_due(limit: int, now: datetime | None = None) -> list[int]:
    """One verified claim of each run below its coverage target, at most ``limit`` runs: the runs re-verified
    longest ago (or never) first, so no run starves behind newer ones. The run's EARLIEST verified claim, which
    no later filing changes. Left out: runs whose re-verifications stalled (their own replays fill the budget:
    tried again after ``REPLAY_STALLED_RETRY_SECONDS``, not every beat) and runs a re-verification disputed."""
    now = now or timezone.now()
    verified = Claim.objects.filter(result=Claim.Result.VERIFIED).order_by("claimed_seq")
    latest: dict[tuple[int, str], int] = {}
    for pk, prover, manifest in verified.values_list("pk", "prover", "manifest").iterator(chunk_size=10000):
        latest.setdefault((prover, manifest), pk)
    last_seq = {
        (prover, manifest): last
        for prover, manifest, last in CoverageReverification.objects.values("claim__prover", "claim__manifest")
        .annotate(last=Max("seq"))
        .values_list("claim__prover", "claim__manifest", "last")
    }
    provers = Organisation.objects.in_bulk({prover for prover, _ in latest})
    waiting = now - timedelta(seconds=settings.REPLAY_STALLED_RETRY_SECONDS)
    due = []
    for key in sorted(latest, key=lambda k: last_seq.get(k, 0)):
        if len(due) >= limit:
            break
        coverage = run_coverage(provers[key[0]], key[1])
        stalled = coverage["stalled_since"] is not None and coverage["stalled_since"] > waiting
        if coverage["segments_total"] and not coverage["target_met"] and not coverage["disputed"] and not stalled:
            due.append(latest[key])
    return due


def cross_run_rechecks_due(limit: int, chip: Chip | None = None) -> list[int]:
    """Verified claims to replay again because a pair of their chip's snapshots across two runs (counters k and
    k + 1) was never judged. A claim's verification judges that pair only when the other run has figures of ours
    (docs/transcripts.md §5); two such claims verified at the same moment each saw the other unreplayed and left
    the pair to it. Due: the pair is listed unchecked in the latest report of BOTH claims (one listing alone means
    the other claim's replay judged it) and both were replayed (each run now has figures). The later claim of the
    pair is re-checked (the earlier one if only it is verified); its new report judges the pair, which ends it.
    Oldest first, at most ``limit``; ``chip``: only that chip's claims."""
    claims = Claim.objects.filter(result__in=REPLAYED_RESULTS, report__has_key="across_runs_unchecked").exclude(
        report__across_runs_unchecked=[]
    )
    if chip is not None:
        claims = claims.filter(snapshot__chip=chip)
    rows = {
        pk: (serial, counter, result, report)
        for pk, serial, counter, result, report in claims.values_list(
            "pk", "snapshot__chip__serial", "snapshot__counter", "result", "report"
        ).iterator(chunk_size=10000)
    }
    later = CoverageReverification.objects.filter(claim__in=list(rows)).order_by("seq")
    latest = {pk: row[3] for pk, row in rows.items()}
    latest.update(dict(later.values_list("claim", "report")))  # a re-verification's report supersedes the claim's
    listed: dict[tuple[str, int], tuple[int, str, set]] = {}
    for pk, (serial, counter, result, _) in rows.items():
        pairs = (latest[pk] or {}).get("across_runs_unchecked") or []
        unjudged = {(p["serial"], *p["counters"]) for p in pairs if isinstance(p, dict) and p.get("serial") == serial}
        listed[serial, counter] = (pk, result, unjudged)
    due = set()
    for (serial, counter), (pk, result, unjudged) in listed.items():
        pair = (serial, counter, counter + 1)
        other = listed.get((serial, counter + 1))
        if pair not in unjudged or other is None or pair not in other[2]:
            continue
        verified = [c for c, r in ((other[0], other[1]), (pk, result)) if r == Claim.Result.VERIFIED]
        if verified:
            due.add(verified[0])
    return sorted(due)[:limit]


def runs() -> list[dict]:
    """Every run with claims (latest first), each with its coverage (the regulator's list of runs)."""
    keys = (
        Claim.objects.values("prover", "manifest")
        .annotate(latest=Max("claimed_seq"))
        .order_by("-latest")
        .values_list("prover", "manifest")
    )
    provers = Organisation.objects.in_bulk({prover for prover, _ in keys})
    return [run_coverage(provers[prover], manifest) for prover, manifest in keys]
