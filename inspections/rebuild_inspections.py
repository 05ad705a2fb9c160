"""Rebuild the inspections tables (and, through ``registry.rebuild_registry``, the registry's) from the ledger alone.

One pass over the ledger's leaves feeds each entry to the registry's replay and to this
module's, into scratch worlds held in memory (never the live tables); then every live
projection row is compared with its rebuilt twin, keyed by natural keys (slugs, serials,
periods, ledger seqs), so database ids do not matter:

    campaign         slug                      parameters as amended, starts/ends, created_seq (and model, where the
                                               field exists), holders, amended_seq, stopped_seq
    campaign provers slug                      the named provers (empty for a country campaign)
    campaign seed    campaign/period           commitment, committed_seq; the seed itself once the draw revealed it
    draw             campaign/period           checkpoint size and root, drawn_seq, drawn_at
    inspection task  campaign/period/serial    prover, inspection body, due_on, status, assigned_seq
    inspection body  organisation              countries, capacity_per_period
    finding          campaign/period/serial    what the inspector recorded, recorded_seq
    alert            raised_seq                kind, prover, chip, task, detail, raised_at, state, assignee,
                                               updated_seq, and every triage action (alert.updated)
    identity check   seq                       task, passed, reason, checked_at (inspection.identity_checked)
    snapshot log     checked_seq               task, sha256, status, problems (the text is not on the ledger:
                                               each live text is hashed against its recorded sha256 instead)
    snapshot         serial/counter            log, time, shard, hash, claim_due_on, and the firmware's work
                                               counters (off the ledger: re-derived from the log text the entry
                                               commits to, checked against its hash and the chip's key)
    claim            serial/counter            prover, run, step, manifest, location, claimed_seq and the result
                                               (final from claim.verified; "error", failures, retry_at from
                                               claim.verification_failed; copy_failures from either), material
                                               and the nonce's hash (claim.material_copied), and the nonce itself
                                               once a later verdict revealed it (a secret until then); the pending
                                               re-verification nonce's hash (claim.reverification_drawn, cleared
                                               by the claim.reverified entry that reveals it)
    claim reverification  seq                  claim, result, mismatch_step, report (claim.reverified)

claim.conflict projects onto the alerts raised with it; its claims must exist (else a ReplayError).

Dates the services take from "today" when they write (a task's due_on, a snapshot's
claim_due_on) are rebuilt from the entry's ledger time. Later entries name a task by its
database id (and its chip); the id is read through the live task's natural key when that
agrees with the chip, else the entry applies to the chip's latest rebuilt task.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.core.exceptions import ValidationError

from ledger import selectors as ledger
from ledger.services import format_time
from registry import rebuild_registry as registry_rebuild
from rules import registry_world
from rules.chip_lifecycle import LifecycleError

from . import verification
from .case_states import case_transition, legacy_next_state
from .models import (
    Alert,
    AlertAction,
    Campaign,
    CampaignSeed,
    Claim,
    CoverageReverification,
    Draw,
    Finding,
    IdentityCheck,
    InspectionBody,
    InspectionTask,
    Snapshot,
    SnapshotLog,
)
from .services.campaigns import TASK_DAYS
from .services.claims import error_report, nonce_commitment
from .services.inspectors import CLAIM_DAYS, FINDING_FIELDS

TaskKey = tuple[str, int, str]  # campaign slug, period, chip serial
CAMPAIGN_FIELDS = (
    "country",
    "rule_flops",
    "detection_probability",
    "snapshot_rate",
    "period_days",
    "run_days",
    "starts_on",
    "ends_on",
)
LIFECYCLE_FIELDS = ("holders", "amended_seq", "stopped_seq")  # a country campaign's targets; amendments and stops
FINDING_DEFAULTS = {
    "owner_refused": False,
    "seal_intact": None,
    "tamper_evidence": None,
    "location_matches": None,
    "photo_hashes": [],
    "notes": "",
}
# the rest of claim.verified is the report
CLAIM_VERDICT_KEYS = {"claim", "chip", "counter", "result", "mismatch_step", "copy_failures"}


def campaign_has_model() -> bool:
    """``Campaign.model`` ("paper" or "exact") is projected where the field exists."""
    return any(f.name == "model" for f in Campaign._meta.get_fields())


class ReplayError(LifecycleError):
    """An inspections entry that cannot be applied to the world the earlier entries made."""


@dataclass
class World:
    registry: registry_world.Scratch = field(default_factory=registry_world.Scratch)
    task_ids: dict[int, TaskKey] = field(default_factory=dict)  # live id -> natural key, to read ids in payloads
    bodies: dict[str, dict] = field(default_factory=dict)
    campaigns: dict[str, dict] = field(default_factory=dict)
    seeds: dict[tuple[str, int], dict] = field(default_factory=dict)
    draws: dict[tuple[str, int], dict] = field(default_factory=dict)
    tasks: dict[TaskKey, dict] = field(default_factory=dict)
    chip_tasks: dict[str, list[TaskKey]] = field(default_factory=dict)
    findings: dict[TaskKey, dict] = field(default_factory=dict)
    alerts: dict[int, dict] = field(default_factory=dict)
    logs: dict[int, dict] = field(default_factory=dict)
    identity_checks: dict[int, tuple] = field(default_factory=dict)  # by seq: task key, passed, reason, time
    snapshots: dict[tuple[str, int], dict] = field(default_factory=dict)
    claims: dict[tuple[str, int], dict] = field(default_factory=dict)
    claim_keys: dict[int, tuple[str, int]] = field(default_factory=dict)  # live claim id -> (serial, counter)
    conflicts: dict[int, dict] = field(default_factory=dict)  # claim.conflict entries by seq
    reverifications: dict[int, dict] = field(default_factory=dict)  # claim.reverified entries by seq


def rebuild(size: int | None = None) -> World:
    """Registry and inspections as the ledger's first ``size`` entries (all by default) make them, in one pass."""
    world = World(task_ids=_live_task_keys(), claim_keys=_live_claim_keys())
    for seq, leaf in ledger.leaves(0, size):
        entry = json.loads(leaf)
        kind, actor, payload = entry["kind"], entry["actor"], entry["payload"]
        registry_world.apply(world.registry, seq, kind, actor, payload)
        try:
            apply(world, seq, entry["time"], kind, actor, payload)
        except (KeyError, TypeError, ValueError) as error:
            raise ReplayError(f"ledger seq {seq}: {kind} cannot be replayed: {error!r}") from error
    return world


def apply(world: World, seq: int, time: str, kind: str, actor: str, payload: dict) -> None:
    """Replay one entry into the inspections scratch world; other kinds pass through."""
    handler = HANDLERS.get(kind)
    if handler:
        handler(world, seq, time, actor, payload)


def _day(time: str) -> date:
    return datetime.fromisoformat(time.replace("Z", "+00:00")).date()


def _body_registered(world, seq, time, actor, payload):
    world.bodies[payload["organisation"]] = {
        "countries": sorted(payload["countries"]),
        "capacity_per_period": payload["capacity_per_period"],
    }


def _campaign_created(world, seq, time, actor, payload):
    world.campaigns[payload["slug"]] = {
        **{name: payload[name] for name in CAMPAIGN_FIELDS},
        "provers": sorted(payload["provers"]),
        "model": payload.get("model", "paper"),
        "holders": payload.get("holders", ""),
        "created_seq": seq,
        "amended_seq": None,
        "stopped_seq": None,
    }


def _campaign_amended(world, seq, time, actor, payload):
    """The parameters in force from now on (the entry restates them all); the campaign's identity stays."""
    campaign, params = world.campaigns[payload["campaign"]], payload["params"]
    campaign.update({name: params[name] for name in CAMPAIGN_FIELDS if name not in ("country", "starts_on")})
    campaign.update(provers=sorted(params["provers"]), model=params.get("model", "paper"), amended_seq=seq)


def _campaign_stopped(world, seq, time, actor, payload):
    world.campaigns[payload["campaign"]].update(ends_on=payload["ends_on"], stopped_seq=seq)


def _seed_committed(world, seq, time, actor, payload):
    world.seeds[(payload["campaign"], payload["period"])] = {
        "commitment": payload["commitment"],
        "committed_seq": seq,
        "revealed": None,
    }


def _drawn(world, seq, time, actor, payload):
    campaign, period = payload["campaign"], payload["period"]
    world.seeds[(campaign, period)]["revealed"] = payload["seed"]
    world.draws[(campaign, period)] = {
        "checkpoint_size": payload["checkpoint"]["size"],
        "checkpoint_root": payload["checkpoint"]["root"],
        "drawn_seq": seq,
        "drawn_at": time,
    }
    due = (_day(time) + timedelta(days=TASK_DAYS)).isoformat()
    for prover, sample in payload["provers"].items():
        for serial in sample["drawn"]:
            key = (campaign, period, serial)
            world.tasks[key] = {
                "prover": prover,
                "inspection_body": payload["assignments"].get(serial),
                "due_on": due,
                "status": InspectionTask.Status.ASSIGNED.value,
                "assigned_seq": seq,
            }
            world.chip_tasks.setdefault(serial, []).append(key)


def _task(world: World, seq: int, task_id, serial: str | None) -> TaskKey | None:
    """The rebuilt task an entry names by database id (and chip serial)."""
    if task_id is None:
        return None
    key = world.task_ids.get(task_id)
    if key is not None and key in world.tasks and serial in (None, key[2]):
        return key
    if serial and world.chip_tasks.get(serial):
        return world.chip_tasks[serial][-1]
    raise ReplayError(f"ledger seq {seq}: names task {task_id} of chip {serial}, which no draw assigned")


def _accepted(world, seq, time, actor, payload):
    world.tasks[_task(world, seq, payload["task"], payload["chip"])]["status"] = InspectionTask.Status.ACCEPTED.value


def _finding(world, seq, time, actor, payload):
    key = _task(world, seq, payload["task"], payload["chip"])
    values = {name: payload[name] for name in FINDING_FIELDS if name in payload}
    world.findings[key] = {
        "chip_found": payload["chip_found"],
        **FINDING_DEFAULTS,
        **values,
        "photo_hashes": payload.get("photo_hashes", []),
        "recorded_seq": seq,
    }
    world.tasks[key]["status"] = InspectionTask.Status.DONE.value


def _identity_checked(world, seq, time, actor, payload):
    key = _task(world, seq, payload["task"], payload["chip"])
    world.identity_checks[seq] = (key, payload["passed"], payload["reason"], time)


def _alert(world, seq, time, actor, payload):
    task = _task(world, seq, payload.get("task"), payload.get("chip"))
    world.alerts[seq] = {
        "kind": payload["kind"],
        "prover": payload["prover"],
        "chip": payload.get("chip"),
        "task": task,
        "detail": payload["detail"],
        "raised_at": time,
        "state": Alert.State.OPEN.value,
        "assignee": "",
        "updated_seq": None,
        "actions": [],
    }
    if payload["kind"] == Alert.Kind.OVERDUE and task is not None:
        world.tasks[task]["status"] = InspectionTask.Status.OVERDUE.value


def _alert_updated(world, seq, time, actor, payload):
    alert = world.alerts.get(payload["alert"])
    if alert is None:
        raise ReplayError(f"ledger seq {seq}: alert.updated names no alert raised at seq {payload['alert']}")
    try:
        state = _case_step(alert["state"], payload)
    except ValidationError as error:
        raise ReplayError(f"ledger seq {seq}: alert.updated cannot be replayed: {error.messages}") from error
    alert.update(state=state, updated_seq=seq, assignee=payload["assignee"] or alert["assignee"])
    alert["actions"].append((seq, payload["action"], payload["by"], payload["reason"], payload["assignee"], state))


def _case_step(current: str, payload: dict) -> str:
    """The state machine for entries that name the state they left (``from``); the older rule for those before it."""
    if "from" not in payload:
        return legacy_next_state(current, payload["action"])
    if payload["from"] != current:
        raise ValidationError(f"it says the case was {payload['from']}, but the ledger left it {current}")
    return case_transition(current, payload["action"])


def _snapshot_log(world, seq, time, actor, payload):
    task = _task(world, seq, payload["task"], payload["chip"])
    problems = payload["problems"]
    world.logs[seq] = {
        "task": task,
        "sha256": payload["log_sha256"],
        "problems": problems,
        "status": (SnapshotLog.Status.PROBLEMS if problems else SnapshotLog.Status.INTACT).value,
    }
    due = (_day(time) + timedelta(days=CLAIM_DAYS)).isoformat()
    works = _log_work(world, seq, payload)
    for record, work in zip(payload["snapshots"], works, strict=True):
        # bulk_create(ignore_conflicts=True): the first log of a (chip, counter) keeps it
        world.snapshots.setdefault(
            (payload["chip"], record["counter"]),
            {
                "log": seq,
                "time": record["time"],
                "shard": record["shard"],
                "hash": record["hash"],
                "claim_due_on": due,
                "work": work,
            },
        )


SNAPSHOT_KEYS = ("counter", "time", "shard", "hash")


def _log_work(world: World, seq: int, payload: dict) -> list[dict | None]:
    """Each logged snapshot's firmware work counters, re-derived from the log's text.

    The counters are kept off the public ledger (a prover's busy time and FLOPs are its own), but the entry
    commits to the text (``log_sha256``) and the text is signed by the chip: the rebuild checks the live text
    against that hash and the chip's key as registered on the ledger, exactly as the service did, and takes
    the counters of the records the entry lists. A text that no longer matches (reported by the "snapshot log
    text" table) or whose records no longer match the entry's gives ``None``: those counters cannot be rebuilt.
    """
    unknown = [None] * len(payload["snapshots"])
    text = SnapshotLog.objects.filter(checked_seq=seq).values_list("text", flat=True).first()
    key = world.registry.chip_extra.get(payload["chip"], {}).get("public_key")
    if not payload["snapshots"] or text is None or key is None:
        return unknown
    if hashlib.sha256(text.encode()).hexdigest() != payload["log_sha256"]:
        return unknown
    try:
        _, records = verification.snapshot_log_check(text, key, payload["chip"])
    except ValueError:  # a registered key that is not a key: nothing to derive
        return unknown
    listed = [{k: r[k] for k in SNAPSHOT_KEYS} for r in records]
    if listed != [{k: r[k] for k in SNAPSHOT_KEYS} for r in payload["snapshots"]]:
        return unknown
    return [{k: str(r[k]) for k in ("busy_ns", "flops")} if "flops" in r else None for r in records]


def _claims_submitted(world, seq, time, actor, payload):
    for item in payload["claims"]:
        world.claims[(item["serial"], item["counter"])] = {
            "prover": actor,
            "run": item["run"],
            "step": item["step"],
            "manifest": item["manifest"],
            "location": item["location"],
            "claimed_seq": seq,
            "result": Claim.Result.PENDING.value,
            "mismatch_step": None,
            "report": {},
            "result_seq": None,
            "failures": 0,
            "retry_at": None,
            "material": "",
            "nonce_sha256": None,
            "nonce": None,
            "copy_failures": 0,
            "reverify_sha256": None,  # the pending re-verification nonce's commitment (claim.reverification_drawn)
        }


def _claim(world: World, seq: int, kind: str, payload: dict) -> dict:
    """The rebuilt claim an entry names by chip and counter (and database id, which must agree where live)."""
    key = (payload["chip"], payload["counter"])
    claim = world.claims.get(key)
    if claim is None:
        raise ReplayError(f"ledger seq {seq}: {kind} names {key[0]} #{key[1]}, which no claim answered")
    return claim


def _reveal_nonce(claim: dict, nonce) -> None:
    """A verdict reveals the nonce it was reached with; it is the claim's own only once one was committed
    (a verdict that predates the claim's nonce carries the verifier's own)."""
    if claim["nonce_sha256"] is not None and claim["nonce"] is None and isinstance(nonce, str) and nonce:
        claim["nonce"] = nonce


def _claim_verified(world, seq, time, actor, payload):
    claim = _claim(world, seq, "claim.verified", payload)
    report = {k: v for k, v in payload.items() if k not in CLAIM_VERDICT_KEYS}
    claim.update(
        result=payload["result"], mismatch_step=payload["mismatch_step"], report=report, result_seq=seq, retry_at=None
    )
    claim["copy_failures"] = payload.get("copy_failures", claim["copy_failures"])
    _reveal_nonce(claim, payload.get("nonce"))


def _claim_reverified(world, seq, time, actor, payload):
    claim = _claim(world, seq, "claim.reverified", payload)
    nonce = payload.get("nonce")
    if isinstance(nonce, str) and _nonce_hash(nonce) == claim["nonce_sha256"]:
        _reveal_nonce(claim, nonce)  # re-verifications before they had nonces of their own reused the claim's
    if (
        claim["reverify_sha256"] is not None
        and isinstance(nonce, str)
        and _nonce_hash(nonce) == claim["reverify_sha256"]
    ):
        claim["reverify_sha256"] = None  # revealed: the next re-verification commits a fresh one
    world.reverifications[seq] = {
        "claim": (payload["chip"], payload["counter"]),
        "result": payload["result"],
        "mismatch_step": payload["mismatch_step"],
        "report": {k: v for k, v in payload.items() if k not in CLAIM_VERDICT_KEYS},
    }


def _reverification_drawn(world, seq, time, actor, payload):
    """A coverage re-verification's own nonce, committed by its hash before the replay; revealed (and then
    replaced by the next one) by the ``claim.reverified`` entry that records it."""
    claim = _claim(world, seq, "claim.reverification_drawn", payload)
    if claim["reverify_sha256"] is not None:
        raise ReplayError(
            f"ledger seq {seq}: a second re-verification nonce for {payload['chip']} #{payload['counter']} "
            "before the first was revealed"
        )
    claim["reverify_sha256"] = payload["nonce_sha256"]


def _material_copied(world, seq, time, actor, payload):
    """The prover's material is in our hands (``Claim.material``, named by its manifest hash) and the claim's
    one nonce is drawn: committed by its hash, revealed by a later verdict."""
    claim = _claim(world, seq, "claim.material_copied", payload)
    if claim["nonce_sha256"] is not None:
        raise ReplayError(f"ledger seq {seq}: a second nonce for {payload['chip']} #{payload['counter']}")
    claim.update(material=payload["manifest"], nonce_sha256=payload["nonce_sha256"])


def _claim_conflict(world, seq, time, actor, payload):
    """Two claims of one chip contradict each other: both must be claims of that chip with the counters named
    (and, where the ids are live, the claims the ids name). Its projection is the ``claim_failed`` alert on each
    claim the service raises with it, compared with the other alerts; no table row of its own."""
    one, two = payload["counters"]
    for counter in (one, two):
        _claim(world, seq, "claim.conflict", {"chip": payload["chip"], "counter": counter})
    for claim_id, counter in ((payload["claim"], one), (payload["with"], two)):
        live = world.claim_keys.get(claim_id)
        if live is not None and live != (payload["chip"], counter):
            raise ReplayError(
                f"ledger seq {seq}: claim.conflict names claim {claim_id} as {payload['chip']} #{counter}, "
                f"which is {live[0]} #{live[1]}"
            )
    world.conflicts[seq] = {"chip": payload["chip"], "counters": (one, two), "kind": payload["kind"]}


def _claim_failed(world, seq, time, actor, payload):
    """The verifier failed on a claim: result error, retried at retry_at (none once the retries ran out)."""
    claim = _claim(world, seq, "claim.verification_failed", payload)
    retry_at = payload["retry_at"]
    when = datetime.fromisoformat(retry_at.replace("Z", "+00:00")) if retry_at else None
    claim.update(
        result=Claim.Result.ERROR.value,
        failures=payload["attempt"],
        retry_at=retry_at,
        report=error_report(payload["error"], payload["attempt"], when),
        result_seq=seq,
    )
    claim["copy_failures"] = payload.get("copy_failures", claim["copy_failures"])


HANDLERS = {
    "inspection_body.registered": _body_registered,
    "campaign.created": _campaign_created,
    "campaign.amended": _campaign_amended,
    "campaign.stopped": _campaign_stopped,
    "campaign.seed_committed": _seed_committed,
    "campaign.drawn": _drawn,
    "inspection.accepted": _accepted,
    "inspection.finding": _finding,
    "alert.raised": _alert,
    "alert.updated": _alert_updated,
    "inspection.snapshot_log": _snapshot_log,
    "claim.submitted": _claims_submitted,
    "claim.verified": _claim_verified,
    "claim.verification_failed": _claim_failed,
    "claim.material_copied": _material_copied,
    "claim.reverification_drawn": _reverification_drawn,
    "claim.conflict": _claim_conflict,
    "claim.reverified": _claim_reverified,
    # the challenges these answer are not on the ledger (private, short-lived): only the outcomes are projected
    "inspection.identity_checked": _identity_checked,
}


# --- comparison -------------------------------------------------------------------------


def differences(world: World, limit: int = 50) -> list[str]:
    """Differences between the live tables of both apps and their rebuild, registry first."""
    return registry_rebuild.compare([*registry_rebuild.tables(world.registry), *tables(world)], limit)


def tables(world: World):
    """(name, live rows, rebuilt rows) for each inspections table."""
    with_model = campaign_has_model()
    yield (
        "campaign",
        _live_campaigns(with_model),
        {
            slug: tuple(c[name] for name in CAMPAIGN_FIELDS)
            + (c["created_seq"],)
            + ((c["model"],) if with_model else ())
            + tuple(c[name] for name in LIFECYCLE_FIELDS)
            for slug, c in world.campaigns.items()
        },
    )
    yield (
        "campaign provers",
        _live_campaign_provers(),
        {slug: tuple(c["provers"]) for slug, c in world.campaigns.items() if c["provers"]},
    )
    yield (
        "campaign seed",
        _live_seeds(world),
        {key: (s["commitment"], s["committed_seq"], s["revealed"]) for key, s in world.seeds.items()},
    )
    yield (
        "draw",
        _live_draws(),
        {
            key: (d["checkpoint_size"], d["checkpoint_root"], d["drawn_seq"], d["drawn_at"])
            for key, d in world.draws.items()
        },
    )
    yield (
        "inspection task",
        _live_tasks(),
        {
            key: (t["prover"], t["inspection_body"], t["due_on"], t["status"], t["assigned_seq"])
            for key, t in world.tasks.items()
        },
    )
    yield (
        "inspection body",
        _live_bodies(),
        {slug: (tuple(b["countries"]), b["capacity_per_period"]) for slug, b in world.bodies.items()},
    )
    yield "finding", _live_findings(), {key: _finding_row(f) for key, f in world.findings.items()}
    yield (
        "alert",
        _live_alerts(),
        {
            seq: (
                a["kind"],
                a["prover"],
                a["chip"],
                a["task"],
                a["detail"],
                a["raised_at"],
                a["state"],
                a["assignee"],
                a["updated_seq"],
                tuple(a["actions"]),
            )
            for seq, a in world.alerts.items()
        },
    )
    yield (
        "snapshot log",
        _live_logs(),
        {seq: (log["task"], log["sha256"], log["status"], log["problems"]) for seq, log in world.logs.items()},
    )
    yield "snapshot log text", _live_log_text_hashes(), {}
    yield "identity check", _live_identity_checks(), world.identity_checks
    yield (
        "snapshot",
        _live_snapshots(),
        {
            key: (s["log"], s["time"], s["shard"], s["hash"], s["claim_due_on"], s["work"])
            for key, s in world.snapshots.items()
        },
    )
    yield "claim", _live_claims(world), {key: _claim_row(c) for key, c in world.claims.items()}
    yield (
        "claim reverification",
        _live_reverifications(),
        {seq: (r["claim"], r["result"], r["mismatch_step"], r["report"]) for seq, r in world.reverifications.items()},
    )


def _finding_row(f: dict) -> tuple:
    return (
        f["chip_found"],
        f["owner_refused"],
        f["seal_intact"],
        f["tamper_evidence"],
        f["location_matches"],
        tuple(f["photo_hashes"]),
        f["notes"],
        f["recorded_seq"],
    )


def _claim_row(c: dict) -> tuple:
    return (
        c["prover"],
        c["run"],
        c["step"],
        c["manifest"],
        c["location"],
        c["claimed_seq"],
        c["result"],
        c["mismatch_step"],
        c["report"],
        c["result_seq"],
        c["failures"],
        c["retry_at"],
        c["material"],
        c["nonce_sha256"],
        c["nonce"],
        c["copy_failures"],
        c["reverify_sha256"],
    )


def _iso(day: date | None) -> str | None:
    return day.isoformat() if day else None


def _live_task_keys() -> dict[int, TaskKey]:
    rows = InspectionTask.objects.values_list("id", "draw__campaign__slug", "draw__period", "chip__serial")
    return {row[0]: tuple(row[1:]) for row in rows.iterator(chunk_size=10000)}


TASK_KEY = ("task__draw__campaign__slug", "task__draw__period", "task__chip__serial")


def _task_key(row: tuple) -> TaskKey | None:
    return None if row[0] is None else tuple(row)


def _live_campaigns(with_model: bool) -> dict:
    columns = ("slug", *CAMPAIGN_FIELDS, "created_seq", *(("model",) if with_model else ()), *LIFECYCLE_FIELDS)
    live = {}
    for row in Campaign.objects.values_list(*columns):
        values = dict(zip(columns, row, strict=True))
        values["starts_on"], values["ends_on"] = _iso(values["starts_on"]), _iso(values["ends_on"])
        slug = values.pop("slug")
        live[slug] = tuple(values.values())
    return live


def _live_campaign_provers() -> dict:
    provers: dict[str, list] = {}
    for campaign, prover in Campaign.provers.through.objects.values_list("campaign__slug", "organisation__slug"):
        provers.setdefault(campaign, []).append(prover)
    return {campaign: tuple(sorted(slugs)) for campaign, slugs in provers.items()}


def _live_seeds(world: World) -> dict:
    """The secret seed is compared only once the draw revealed it on the ledger."""
    rows = CampaignSeed.objects.values_list("campaign__slug", "period", "commitment", "committed_seq", "seed")
    live = {}
    for campaign, period, commitment, committed_seq, seed in rows:
        revealed = (world.seeds.get((campaign, period)) or {}).get("revealed")
        live[(campaign, period)] = (commitment, committed_seq, bytes(seed).hex() if revealed else None)
    return live


def _live_draws() -> dict:
    rows = Draw.objects.values_list(
        "campaign__slug", "period", "checkpoint_size", "checkpoint_root", "drawn_seq", "drawn_at"
    )
    return {
        (campaign, period): (size, _b64(root), seq, format_time(at)) for campaign, period, size, root, seq, at in rows
    }


def _b64(value) -> str:
    return base64.b64encode(bytes(value)).decode()


def _live_tasks() -> dict:
    rows = InspectionTask.objects.values_list(
        "draw__campaign__slug",
        "draw__period",
        "chip__serial",
        "prover__slug",
        "inspection_body__slug",
        "due_on",
        "status",
        "assigned_seq",
    )
    return {
        (c, p, serial): (prover, body, _iso(due), status, seq)
        for c, p, serial, prover, body, due, status, seq in rows.iterator(chunk_size=10000)
    }


def _live_bodies() -> dict:
    rows = InspectionBody.objects.values_list("organisation__slug", "countries", "capacity_per_period")
    return {slug: (tuple(sorted(countries)), capacity) for slug, countries, capacity in rows}


def _live_findings() -> dict:
    rows = Finding.objects.values_list(
        *TASK_KEY,
        "chip_found",
        "owner_refused",
        "seal_intact",
        "tamper_evidence",
        "location_matches",
        "photo_hashes",
        "notes",
        "recorded_seq",
    )
    return {tuple(row[:3]): (*row[3:8], tuple(row[8]), *row[9:]) for row in rows}


def _live_alerts() -> dict:
    rows = Alert.objects.values_list(
        "raised_seq",
        "kind",
        "prover__slug",
        "chip__serial",
        *TASK_KEY,
        "detail",
        "raised_at",
        "state",
        "assignee",
        "updated_seq",
    )
    actions = {}
    for row in AlertAction.objects.values_list(
        "alert__raised_seq", "seq", "action", "by", "reason", "assignee", "state"
    ):
        actions.setdefault(row[0], []).append(row[1:])
    return {
        row[0]: (
            *row[1:4],
            _task_key(row[4:7]),
            row[7],
            format_time(row[8]),
            *row[9:12],
            tuple(actions.get(row[0], ())),
        )
        for row in rows
    }


def _live_logs() -> dict:
    """Checked logs only: an upload waiting for its check has no entry yet."""
    rows = SnapshotLog.objects.exclude(checked_seq=None).values_list(
        "checked_seq", *TASK_KEY, "sha256", "status", "problems"
    )
    return {row[0]: (_task_key(row[1:4]), *row[4:]) for row in rows}


def _live_log_text_hashes() -> dict:
    """A log whose text no longer hashes to its recorded sha256 (the one on the ledger once checked)."""
    found = {}
    for pk, text, sha256 in SnapshotLog.objects.values_list("id", "text", "sha256").iterator(chunk_size=100):
        actual = hashlib.sha256(text.encode()).hexdigest()
        if actual != sha256:
            found[f"id={pk}"] = f"text sha256 {actual} != recorded {sha256}"
    return found


def _live_snapshots() -> dict:
    rows = Snapshot.objects.values_list(
        "chip__serial", "counter", "log__checked_seq", "time", "shard", "hash", "claim_due_on", "work"
    )
    return {
        (serial, counter): (log, time, shard, digest, _iso(due), work)
        for serial, counter, log, time, shard, digest, due, work in rows.iterator(chunk_size=10000)
    }


def _live_claim_keys() -> dict[int, tuple[str, int]]:
    rows = Claim.objects.values_list("id", "snapshot__chip__serial", "snapshot__counter")
    return {pk: (serial, counter) for pk, serial, counter in rows.iterator(chunk_size=10000)}


def _live_claims(world: World) -> dict:
    """The nonce is private until a verdict reveals it: before, only its hash is compared with the ledger's
    commitment (``claim.material_copied``); the nonce itself once the ledger revealed it (as a seed is)."""
    rows = Claim.objects.values_list(
        "snapshot__chip__serial",
        "snapshot__counter",
        "prover__slug",
        "run",
        "step",
        "manifest",
        "location",
        "claimed_seq",
        "result",
        "mismatch_step",
        "report",
        "result_seq",
        "failures",
        "retry_at",
        "material",
        "nonce",
        "copy_failures",
        "reverify_nonce",
    )
    live = {}
    for serial, counter, *values, retry_at, material, nonce, copy_failures, again in rows.iterator(chunk_size=10000):
        revealed = (world.claims.get((serial, counter)) or {}).get("nonce")
        live[(serial, counter)] = (
            *values,
            _time(retry_at),
            material,
            _nonce_hash(nonce),
            nonce if revealed is not None else None,
            copy_failures,
            _nonce_hash(again),
        )
    return live


def _live_identity_checks() -> dict:
    rows = IdentityCheck.objects.values_list("seq", *TASK_KEY, "passed", "reason", "checked_at")
    return {
        seq: ((slug, period, serial), passed, reason, _time(at))
        for seq, slug, period, serial, passed, reason, at in rows.iterator(chunk_size=10000)
    }


def _live_reverifications() -> dict:
    rows = CoverageReverification.objects.values_list(
        "seq", "claim__snapshot__chip__serial", "claim__snapshot__counter", "result", "mismatch_step", "report"
    )
    return {seq: ((serial, counter), *rest) for seq, serial, counter, *rest in rows.iterator(chunk_size=10000)}


def _nonce_hash(nonce: str) -> str | None:
    if not nonce:
        return None
    try:
        return nonce_commitment(nonce)
    except ValueError:  # not hex: it cannot be the committed nonce
        return f"not a hex nonce: {nonce[:40]!r}"


def _time(when: datetime | None) -> str | None:
    return format_time(when) if when else None
