"""Campaigns: create, commit a period's seed, draw the sample against a checkpoint, and the beat's due draws.

Each write is a ledger entry (``campaign.created``, ``campaign.seed_committed``, ``campaign.drawn``)
with its projection rows in the same transaction.
"""

from __future__ import annotations

import base64
import logging
import math
from datetime import date, timedelta

from django.db import connection, transaction
from django.utils import timezone

from ledger import services as ledger
from registry.models import Chip, Organisation, Role
from rules import draw_ranking, sampling_plans
from rules.inspection_planning import (
    AMENDABLE,
    DEFAULT_MODEL,
    ELIGIBLE,
    MODELS,
    OWNERS_ONLY,
    Coverage,
    Holdings,
    assign,
    campaign_period,
    prover_sample,
)

from .. import selectors
from ..models import Alert, Campaign, CampaignSeed, Draw, InspectionBody, InspectionTask
from .alerts import CLOSED, alert_raise
from .notifications import assignment_notices_queue
from .validation import country_clean
from .validation import fail as _fail

log = logging.getLogger(__name__)
TASK_DAYS = 14  # an inspection is due this many days after the draw
MAX_DAYS = 36_525  # a hundred years: periods and runs stay far inside every database's date and integer range
PLAN_FIELDS = {"flops": "rule_flops", "p": "detection_probability"}  # sampling's names -> the campaign's


def _number_check(field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _fail(field, f"must be a finite number, not {value!r}")


def _dates_check(starts_on, ends_on, period_days: int) -> None:
    if not isinstance(starts_on, date) or (ends_on is not None and not isinstance(ends_on, date)):
        _fail("starts_on", "must be a date")
    if ends_on is not None and ends_on < starts_on:
        _fail("ends_on", f"must not be before the start ({starts_on.isoformat()})")
    try:
        starts_on + timedelta(days=MAX_DAYS + period_days)  # every period the draw computes stays a date
    except OverflowError:
        _fail("starts_on", "too far in the future")


def campaign_clean(
    *,
    slug: str,
    rule_flops: float,
    starts_on: date,
    provers: list[str] = (),
    country: str = "",
    detection_probability: float = 0.9,
    snapshot_rate: float = 0.1,
    period_days: int = 30,
    run_days: int = 365,
    ends_on: date | None = None,
    model: str = DEFAULT_MODEL,
    today: date | None = None,
) -> dict:
    """The ``campaign.created`` payload, checked; writes nothing (the admin's preview shows its plan first).

    ``today`` (default: the server's date) is the day before which a campaign may not start: no backdating."""
    country = country_clean(country) if (country or "").strip() else ""  # an assigned ISO 3166-1 code, or none
    if Campaign.objects.filter(slug=slug).exists():
        _fail("slug", f"{slug!r} is taken")
    if bool(provers) == bool(country):
        _fail("provers", "name the provers, or a country whose chip holders are all targeted — one of the two")
    _provers_check(provers)
    _start_check(starts_on, today or timezone.now().date())
    _number_check("rule_flops", rule_flops)
    _number_check("detection_probability", detection_probability)
    _number_check("snapshot_rate", snapshot_rate)
    if not rule_flops > 0:
        _fail("rule_flops", "must be positive")
    if not 0 < detection_probability < 1:
        _fail("detection_probability", "must be between 0 and 1")
    if not snapshot_rate > 0:
        _fail("snapshot_rate", "must be positive: a chip that never logs a snapshot can never be caught")
    for name, days in (("period_days", period_days), ("run_days", run_days)):
        if type(days) is not int or not 0 < days <= MAX_DAYS:
            _fail(name, f"a whole number of days from 1 to {MAX_DAYS}")
    if not 0 < period_days <= run_days:
        _fail("period_days", "must be positive and at most run_days")
    _dates_check(starts_on, ends_on, period_days)
    if model not in MODELS:
        _fail("model", f"one of {list(MODELS)}")
    _plan_check(rule_flops, detection_probability, snapshot_rate, period_days, run_days)
    params = {
        "slug": slug,
        "provers": sorted(provers),
        "country": country,
        "rule_flops": rule_flops,
        "detection_probability": detection_probability,
        "snapshot_rate": snapshot_rate,
        "period_days": period_days,
        "run_days": run_days,
        "starts_on": starts_on.isoformat(),
        "ends_on": ends_on.isoformat() if ends_on else None,
        "model": model,
        **({"holders": OWNERS_ONLY} if country else {}),
    }
    return params


def campaign_targets_check(params: dict) -> None:
    """No campaign without a prover: a country where no owner/operator holds chips a draw counts is refused (the
    preview shows "no prover" and offers no Create; ``campaign_create`` refuses it whoever calls)."""
    provers = list(Organisation.objects.filter(slug__in=params["provers"]))
    if not selectors.targets_of(params["country"], provers, params.get("holders") == OWNERS_ONLY):
        _fail("country", f"no prover: no owner/operator holds chips a draw counts in {params['country']}")


def _provers_check(provers) -> None:
    """Every named prover is a registered owner/operator: a vendor, fab or inspection body trains nothing."""
    found = {org.slug: org for org in Organisation.objects.filter(slug__in=provers)}
    if len(found) != len(set(provers)):
        _fail("provers", f"unknown: {sorted(set(provers) - set(found))}")
    not_owners = sorted(slug for slug, org in found.items() if not org.has_role(Role.OWNER))
    if not_owners:
        _fail("provers", f"not an owner/operator (prover): {not_owners}")


def _start_check(starts_on, today: date) -> None:
    if isinstance(starts_on, date) and starts_on < today:
        _fail("starts_on", f"must not be in the past: the earliest start is today, {today.isoformat()}")


def _plan_check(rule_flops, detection_probability, snapshot_rate, period_days, run_days) -> None:
    try:  # the plan must be representable: e.g. H = 1e40 (a typo for 1e26) needs more than 2^53 chips
        sampling_plans.plan(rule_flops, 1, detection_probability, snapshot_rate, period_days, run_days)
    except sampling_plans.PlanError as error:
        _fail(PLAN_FIELDS.get(error.field, error.field), error.message)


@transaction.atomic
def campaign_create(*, actor: str = "regulator", **fields) -> Campaign:
    """Put the campaign on the ledger (``campaign.created``) with its first seed's commitment; ``fields`` as
    ``campaign_clean`` takes them. Its checks run under the ledger's lock: a twin created at the same moment
    is then committed and seen (the slug refused by name), not a unique violation at the insert."""
    ledger.ledger_write_lock()
    params = campaign_clean(**fields)
    campaign_targets_check(params)
    starts_on, ends_on = fields["starts_on"], fields.get("ends_on")
    targets = list(Organisation.objects.filter(slug__in=params["provers"]))
    entry = ledger.append_entry("campaign.created", params, actor)
    names = ("slug", "country", "rule_flops", "detection_probability", "snapshot_rate", "period_days", "run_days")
    campaign = Campaign.objects.create(
        **{name: params[name] for name in names},
        starts_on=starts_on,
        ends_on=ends_on,
        model=params["model"],
        holders=params.get("holders", ""),
        created_seq=entry.seq,
    )
    campaign.provers.set(targets)
    _commit_seed(campaign, campaign_period(campaign, timezone.now().date()) or 0, actor)
    return campaign


def campaign_params(campaign: Campaign) -> dict:
    """The parameters in force, in the shape of the ``campaign.created`` payload (what an amendment restates)."""
    names = ("slug", "country", "rule_flops", "detection_probability", "snapshot_rate", "period_days", "run_days")
    return {
        **{name: getattr(campaign, name) for name in names},
        "provers": sorted(campaign.provers.values_list("slug", flat=True)),
        "starts_on": campaign.starts_on.isoformat(),
        "ends_on": campaign.ends_on.isoformat() if campaign.ends_on else None,
        "model": campaign.model,
        **({"holders": campaign.holders} if campaign.holders else {}),
    }


def _open_check(campaign: Campaign) -> None:
    if campaign.stopped_seq is not None:
        _fail("campaign", f"{campaign.slug} was stopped (ledger seq {campaign.stopped_seq}): start a new campaign")


def campaign_amend_clean(campaign: Campaign, *, today: date | None = None, **changes) -> dict:
    """The ``campaign.amended`` payload, checked; writes nothing. Only ``AMENDABLE`` fields change, from the next
    draw on; the whole parameter set in force is restated, with the seq of the entry it supersedes."""
    _open_check(campaign)
    today = today or timezone.now().date()
    unknown = sorted(set(changes) - set(AMENDABLE))
    if unknown:
        _fail(unknown[0], f"cannot be amended (amendable: {', '.join(AMENDABLE)}); start a new campaign instead")
    before = campaign_params(campaign)
    after = {**before, **changes}
    if isinstance(after["ends_on"], date):
        after["ends_on"] = after["ends_on"].isoformat()
    after["provers"] = sorted(after["provers"])
    changed = sorted(name for name in changes if after[name] != before[name])
    if not changed:
        _fail("campaign", "nothing to amend: every value given is the one in force")
    if "provers" in changed:
        if campaign.country:
            _fail("provers", f"a country campaign targets every owner/operator in {campaign.country}")
        if not after["provers"]:
            _fail("provers", "no prover: name at least one")
        _provers_check(after["provers"])
    for name in ("rule_flops", "detection_probability", "snapshot_rate"):
        _number_check(name, after[name])
    if not 0 < after["detection_probability"] < 1:
        _fail("detection_probability", "must be between 0 and 1")
    if after["model"] not in MODELS:
        _fail("model", f"one of {list(MODELS)}")
    if "ends_on" in changed and after["ends_on"] is not None:
        ends_on = date.fromisoformat(after["ends_on"])
        if ends_on < max(today, campaign.starts_on):
            _fail("ends_on", f"must not be before {max(today, campaign.starts_on).isoformat()}: to end now, stop it")
    _plan_check(
        after["rule_flops"],
        after["detection_probability"],
        after["snapshot_rate"],
        after["period_days"],
        after["run_days"],
    )
    supersedes = campaign.amended_seq if campaign.amended_seq is not None else campaign.created_seq
    return {"campaign": campaign.slug, "supersedes": supersedes, "changed": changed, "params": after}


@transaction.atomic
def campaign_amend(campaign: Campaign, *, actor: str = "regulator", today: date | None = None, **changes) -> Campaign:
    """Supersede the campaign's parameters from the next draw on (``campaign.amended``); draws already made keep
    theirs: the audit recomputes each draw with the parameters in force when it was drawn."""
    campaign = Campaign.objects.select_for_update(no_key=True).get(pk=campaign.pk)
    payload = campaign_amend_clean(campaign, today=today, **changes)
    entry = ledger.append_entry("campaign.amended", payload, actor)
    params = payload["params"]
    for name in ("rule_flops", "detection_probability", "snapshot_rate", "model"):
        setattr(campaign, name, params[name])
    campaign.ends_on = date.fromisoformat(params["ends_on"]) if params["ends_on"] else None
    campaign.amended_seq = entry.seq
    campaign.save()
    if not campaign.country:
        campaign.provers.set(Organisation.objects.filter(slug__in=params["provers"]))
    return campaign


@transaction.atomic
def campaign_stop(
    campaign: Campaign, *, on: date | None = None, actor: str = "regulator", today: date | None = None
) -> Campaign:
    """No draw from ``on`` (default today, never earlier) on: a ``campaign.stopped`` entry superseding the last one
    in force, whose ``ends_on`` is the last day with draws. Tasks already drawn stay open."""
    campaign = Campaign.objects.select_for_update(no_key=True).get(pk=campaign.pk)
    _open_check(campaign)
    today = today or timezone.now().date()
    on = on or today
    if not isinstance(on, date) or on < today:
        _fail("on", f"must not be in the past: the earliest stop is today, {today.isoformat()}")
    last_day = on - timedelta(days=1)
    if campaign.ends_on is not None and campaign.ends_on <= last_day:
        _fail("on", f"the campaign already ends on {campaign.ends_on.isoformat()}")
    supersedes = campaign.amended_seq if campaign.amended_seq is not None else campaign.created_seq
    payload = {"campaign": campaign.slug, "supersedes": supersedes, "ends_on": last_day.isoformat()}
    entry = ledger.append_entry("campaign.stopped", payload, actor)
    campaign.ends_on, campaign.stopped_seq = last_day, entry.seq
    campaign.save(update_fields=["ends_on", "stopped_seq"])
    return campaign


@transaction.atomic
def campaign_seed_commit(campaign: Campaign, period: int, actor: str = "regulator") -> CampaignSeed:
    if CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} already has a committed seed")
    return _commit_seed(campaign, period, actor)


def _commit_seed(campaign: Campaign, period: int, actor: str) -> CampaignSeed:
    seed = draw_ranking.new_seed()
    commitment = draw_ranking.commitment(seed)
    entry = ledger.append_entry(
        "campaign.seed_committed", {"campaign": campaign.slug, "period": period, "commitment": commitment}, actor
    )
    return CampaignSeed.objects.create(
        campaign=campaign, period=period, seed=seed, commitment=commitment, committed_seq=entry.seq
    )


def campaigns_draw_due(today: date) -> list[str]:
    """Draw every active campaign whose current period has not been drawn yet ("slug:period" each).

    A period whose seed was never committed (the service was down through a whole
    period) gets its commitment now and is drawn on the next run, never in the same one.
    """
    done = []
    for campaign in Campaign.objects.order_by("slug"):
        try:  # each campaign in its own transaction: one that fails must not stop the others
            drawn = _draw_if_due(campaign, today)
        except Exception as error:
            log.exception("campaign %s: the due draw failed", campaign.slug)
            _draw_failed_alert(campaign, error)
            continue
        if drawn:
            done.append(drawn)
    return done


def _locked_campaign(campaign: Campaign) -> Campaign:
    """The campaign re-read under its row lock, as amend and stop take it (then the ledger's): a draw sees an
    amendment or a stop committed since its caller read the campaign, and none lands while it draws. A draw
    made with parameters older than an amendment before it on the ledger would fail the public audit."""
    return Campaign.objects.select_for_update(of=("self",), no_key=True).get(pk=campaign.pk)


@transaction.atomic
def _draw_if_due(campaign: Campaign, today: date) -> str | None:
    campaign = _locked_campaign(campaign)
    period = campaign_period(campaign, today)
    if period is None or Draw.objects.filter(campaign=campaign, period=period).exists():
        return None
    if not CampaignSeed.objects.filter(campaign=campaign, period=period).exists():
        campaign_seed_commit(campaign, period)
        return None
    campaign_draw(campaign, period)
    return f"{campaign.slug}:{period}"


def _draw_failed_alert(campaign: Campaign, error: Exception) -> None:
    """One open alert per failing campaign (not one per beat run), against its first target."""
    detail = f"campaign {campaign.slug}: the due draw failed ({type(error).__name__}: {str(error)[:300]})"
    try:
        with transaction.atomic():
            ledger.ledger_write_lock()  # before "already alerted?": two overlapping beat runs raise one alert
            if (
                Alert.objects.filter(kind=Alert.Kind.DRAW_FAILED, detail__startswith=f"campaign {campaign.slug}:")
                .exclude(state__in=CLOSED)
                .exists()
            ):
                return
            targets = selectors.campaign_targets(campaign)
            prover = targets[0][0] if targets else campaign.provers.order_by("slug").first()
            if prover is None:
                log.error("%s (no prover to raise the alert against)", detail)
                return
            alert_raise(Alert.Kind.DRAW_FAILED, prover, detail)
    except Exception:
        log.exception("campaign %s: the draw-failed alert could not be raised", campaign.slug)


@transaction.atomic
def campaign_draw(campaign: Campaign, period: int, actor: str = "regulator") -> Draw:
    """Draw the period's sample against a fresh checkpoint, reveal the seed, commit the next one."""
    campaign = _locked_campaign(campaign)
    seed = CampaignSeed.objects.select_for_update(no_key=True).filter(campaign=campaign, period=period).first()
    if seed is None:
        _fail("period", f"no seed was committed for period {period}")
    if Draw.objects.filter(campaign=campaign, period=period).exists():
        _fail("period", f"period {period} was already drawn")
    # Signed under the ledger lock, held to the end of this transaction: the registry read
    # below is exactly the ledger's first checkpoint.size entries, which the audit replays.
    checkpoint = ledger.checkpoint_sign()
    root = bytes(checkpoint.root)
    provers = {}
    for prover, count, peak in selectors.campaign_targets(campaign):
        holdings = Holdings(
            count, peak, lambda seed_, root_, slug, k, prover=prover: _ranked_in_database(prover, seed_, root_, slug, k)
        )
        provers[prover.slug] = prover_sample(campaign, prover.slug, holdings, bytes(seed.seed), root)
    today = timezone.now().date()
    assignments = _assign(provers)
    payload = {
        "campaign": campaign.slug,
        "period": period,
        "seed": bytes(seed.seed).hex(),
        "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(root).decode()},
        "provers": provers,
        "assignments": assignments,
    }
    entry = ledger.append_entry("campaign.drawn", payload, actor)
    draw = Draw.objects.create(
        campaign=campaign,
        period=period,
        checkpoint_size=checkpoint.size,
        checkpoint_root=root,
        drawn_seq=entry.seq,
        drawn_at=entry.time,
    )
    _create_tasks(draw, provers, assignments, today, entry.seq)
    _commit_seed(campaign, period + 1, actor)
    return draw


def _ranked_in_database(prover: Organisation, seed: bytes, root: bytes, campaign: str, count: int) -> list[str]:
    """The draw's ranking, computed where the chips are.

    PostgreSQL computes the HMAC from its built-in SHA-256 (RFC 2104 pads from draw_ranking.hmac_pads)
    and keeps the top N, so ten million chips never leave the database; elsewhere the serials are
    streamed through draw_ranking.draw. Both give the same order: bytea sorts like Python bytes
    (tests/inspections/services/test_campaigns.py checks it on PostgreSQL).
    """
    if connection.vendor == "postgresql":
        inner, outer = draw_ranking.hmac_pads(seed)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT serial FROM registry_chip WHERE owner_id = %s AND status = ANY(%s) "
                "ORDER BY sha256(%s::bytea || sha256(%s::bytea || convert_to(serial, 'UTF8'))) LIMIT %s",
                [prover.pk, ELIGIBLE, outer, inner + draw_ranking.rank_prefix(root, campaign), count],
            )
            return [serial for (serial,) in cursor.fetchall()]
    serials = Chip.objects.filter(owner=prover, status__in=ELIGIBLE).values_list("serial", flat=True)
    return draw_ranking.draw(seed, root, campaign, serials.iterator(chunk_size=20_000), count)


def _assign(provers: dict) -> dict[str, str | None]:
    countries = dict(
        Chip.objects.filter(serial__in=[s for p in provers.values() for s in p["drawn"]]).values_list(
            "serial", "country"
        )
    )
    bodies = [
        Coverage(body.organisation.slug, body.countries, body.capacity_per_period)
        for body in InspectionBody.objects.select_related("organisation")
    ]
    return assign(countries, bodies)


def _create_tasks(draw: Draw, provers: dict, assignments: dict, today: date, seq: int) -> None:
    chips = {chip.serial: chip for chip in Chip.objects.filter(serial__in=assignments)}
    orgs = {org.slug: org for org in Organisation.objects.all()}
    due = today + timedelta(days=TASK_DAYS)
    tasks = InspectionTask.objects.bulk_create(
        [
            InspectionTask(
                draw=draw,
                chip=chips[serial],
                prover=orgs[prover],
                inspection_body=orgs.get(assignments[serial]),
                due_on=due,
                assigned_seq=seq,
            )
            for prover, sample in provers.items()
            for serial in sample["drawn"]
        ]
    )
    for task in tasks:
        if task.inspection_body is None:
            alert_raise(
                Alert.Kind.UNASSIGNED,
                task.prover,
                f"no inspection body with capacity covers {task.chip.country} for {task.chip.serial}",
                task.chip,
                task,
            )
    assignment_notices_queue(draw)  # each body's members: emailed by the worker, re-sent by the sweep if lost
