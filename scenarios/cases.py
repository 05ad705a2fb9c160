"""The scenarios: an honest prover who passes, and each kind of cheater, caught for the right reason.

Each scenario builds its world on an empty ledger, lets the system run (the worker checks logs
and replays transcripts), and returns what it expected and what the system did. The verdicts are
read back from the system's own records: alerts and claim results, each on the ledger.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from nacl.signing import SigningKey

from inspections.models import Alert, Claim
from inspections.services import sweeps
from registry import services as registry
from registry.models import Chip
from replay.protocol.firmware import canonical

from .actors import World


@dataclass
class Outcome:
    """What a scenario expected, check by check; ``story`` says what happened, in order."""

    story: list[str] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)  # (expectation, met, what the system did)

    def tell(self, line: str) -> None:
        self.story.append(line)

    def expect(self, what: str, met: bool, evidence: str = "") -> None:
        self.checks.append((what, bool(met), evidence))

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(met for _, met, _ in self.checks)


def _alerts(world: World, kind: str, prover: str) -> list[Alert]:
    return world.alerts(kind, prover)


def _describe(alerts: list[Alert]) -> str:
    return "; ".join(f"[{a.kind} seq {a.raised_seq}] {a.detail}" for a in alerts) or "no alert"


def _claims_summary(prover: str) -> dict[str, int]:
    results = {}
    for result in Claim.objects.filter(prover__slug=prover).values_list("result", flat=True):
        results[result] = results.get(result, 0) + 1
    return results


def _inspect_all(world: World, out: Outcome, prover: str) -> None:
    tasks = world.tasks(prover)
    for task in tasks:
        world.inspect(task)
    out.tell(
        f"the campaign drew {len(tasks)} chips of {prover}; inspectors checked each chip's identity and read its log"
    )


# --- honest ------------------------------------------------------------------------------------------
def honest(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    chips_a, chips_b = world.fabricate(10), world.fabricate(4)
    world.sell(chips_a, "prover-a")
    world.sell(chips_b, "prover-b")
    out.tell("vendor-us shipped 10 chips to prover-a and 4 to prover-b; both recorded receipt and installation")
    transcript = world.train("prover-a", chips_a[:4], seed=6, rate=0.02)
    out.tell("prover-a trained a small model on 4 of its chips; the chips logged signed snapshot hashes")
    world.campaign(["prover-a", "prover-b"])
    first, *rest = world.tasks("prover-a")
    # The inspector mistypes the chip's signature once, then retries within the deadline.
    world.inspect_accept(first)
    failed = world.identity(first, signature="A" * 86 + "==")
    retried = world.identity(first)
    world.inspect_rest(first)
    for task in rest + world.tasks("prover-b"):
        world.inspect(task)
    out.tell(
        f"inspectors inspected {len(rest) + 1 + len(world.tasks('prover-b'))} drawn chips (one identity check mistyped, then retried)"
    )
    identity_alerts = _alerts(world, Alert.Kind.IDENTITY_FAILED, "prover-a")
    out.expect(
        "a mistyped identity answer fails, the retry passes and supersedes its alert",
        not failed["passed"]
        and retried["passed"]
        and len(identity_alerts) == 1
        and identity_alerts[0].state == Alert.State.SUPERSEDED,
        f"first {failed['reason']!r}, retry passed={retried['passed']}, alert state "
        f"{[a.state for a in identity_alerts]}",
    )
    world.wait_for_worker()
    claims = world.answer_snapshots("prover-a", transcript)
    out.tell(f"prover-a answered all {len(claims)} logged snapshots with claims through the signed API")
    finished = world.wait_for_worker()
    results = _claims_summary("prover-a")
    out.expect(
        "the worker verified every claim", finished and claims and results == {"verified": len(claims)}, str(results)
    )
    open_alerts = [a for a in world.alerts() if a.state == Alert.State.OPEN]
    out.expect("no open alert", not open_alerts, _describe(open_alerts))
    return out


# --- hidden-chips ------------------------------------------------------------------------------------
def hidden_chips(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    declared, hidden = world.fabricate(4), world.fabricate(4)
    world.sell(declared, "prover-b")
    world.sell(hidden, "prover-b", receive=False)
    out.tell("prover-b bought 8 chips; it recorded receipt of 4 and never recorded receipt of the other 4")
    world.train("prover-b", hidden, seed=2)
    out.tell("prover-b trained on the 4 chips the registry still shows in transit")
    world.campaign(["prover-b"])
    for task in world.tasks("prover-b"):
        found_elsewhere = task.chip.serial in hidden
        world.inspect(task, finding={"chip_found": True, "location_matches": not found_elsewhere})
    out.tell("inspectors found the in-transit chips racked in prover-b's data centre and read their logs")
    world.wait_for_worker()
    caught = _alerts(world, Alert.Kind.UNRECORDED_USE, "prover-b")
    caught_chips = {a.chip.serial for a in caught}
    out.expect(
        "each hidden chip that logged training is flagged: used while the registry says in transit",
        caught_chips and caught_chips <= set(hidden),
        _describe(caught),
    )
    out.expect("no declared chip is flagged", not caught_chips & set(declared), "")
    return out


# --- forged-log --------------------------------------------------------------------------------------
def forged_log(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    chips = world.fabricate(3)
    world.sell(chips, "prover-b")
    world.train("prover-b", chips, seed=1)
    logs = {s: world.chips.export(s).splitlines() for s in chips}
    forged_chip, gap_chip, wrong_chip = chips
    # One line rewritten and re-signed with a key that is not the chip's; one line deleted from another log.
    record = json.loads(logs[forged_chip][0])
    record["hash"] = "0" * 64
    unsigned = {k: v for k, v in record.items() if k != "sig"}
    record["sig"] = base64.b64encode(SigningKey.generate().sign(canonical(unsigned)).signature).decode()
    logs[forged_chip][0] = canonical(record).decode()
    del logs[gap_chip][0]
    out.tell(f"prover-b rewrote a snapshot of {forged_chip} (signed with its own key) and deleted one from {gap_chip}")
    world.campaign(["prover-b"])
    for task in world.tasks("prover-b"):
        serial = task.chip.serial
        if serial == wrong_chip:
            # The inspector first uploads the wrong chip's file: told whose log it is, then corrects it.
            world.inspect_accept(task)
            world.identity(task)
            try:
                world.upload(task, "\n".join(logs[forged_chip]) + "\n")
                mixup = "accepted"
            except ValidationError as error:
                mixup = "; ".join(error.messages)
            world.upload(task, "\n".join(logs[serial]) + "\n")
            world.inspect_rest(task, upload=False)
        else:
            world.inspect(task, log="\n".join(logs[serial]) + "\n")
    world.wait_for_worker()
    out.expect(
        "a log of another chip is reported as such, not as forged lines",
        f"log belongs to chip {forged_chip}" in mixup,
        mixup,
    )
    problems = {a.chip.serial: a.detail for a in _alerts(world, Alert.Kind.LOG_PROBLEMS, "prover-b")}
    out.expect(
        f"{forged_chip}: the re-signed line is reported forged",
        "forged" in problems.get(forged_chip, ""),
        problems.get(forged_chip, "no alert"),
    )
    out.expect(
        f"{gap_chip}: the deleted line is reported as a gap",
        "gap" in problems.get(gap_chip, ""),
        problems.get(gap_chip, "no alert"),
    )
    out.expect(f"{wrong_chip}: its own log is intact", wrong_chip not in problems, problems.get(wrong_chip, ""))
    return out


# --- no-claim ----------------------------------------------------------------------------------------
def no_claim(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    chips = world.fabricate(4)
    world.sell(chips, "prover-b")
    world.train("prover-b", chips, seed=3)
    world.campaign(["prover-b"])
    _inspect_all(world, out, "prover-b")
    world.wait_for_worker()
    out.tell("prover-b never answered the logged snapshots")
    early = sweeps.unanswered_sweep(world.later(1))
    late = sweeps.unanswered_sweep(world.later(31))
    out.tell("the regulator's sweep ran the next day and again 31 days later, past the 30-day deadline")
    caught = _alerts(world, Alert.Kind.UNANSWERED, "prover-b")
    out.expect("nothing is raised before the deadline", early == 0, f"{early} alerts the next day")
    out.expect(
        "every logged snapshot is reported unanswered after the deadline",
        late > 0 and len(caught) == late,
        _describe(caught),
    )
    return out


# --- spoofed-transcript ------------------------------------------------------------------------------
def spoofed_transcript(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    chips_a, chips_b = world.fabricate(3), world.fabricate(3)
    world.sell(chips_a, "prover-a")
    world.sell(chips_b, "prover-b")
    real_a = world.train("prover-a", chips_a, seed=3)
    real_b = world.train("prover-b", chips_b, seed=6)
    out.tell("prover-a and prover-b each trained on their chips; the chips logged snapshots of that training")
    # prover-a shows a transcript of another, innocent run, claiming the same steps.
    decoy = world.train_off_chips("prover-a", chips_a, seed=50)
    # prover-b shows its real transcript with a checkpoint fabricated to import weights from elsewhere.
    fabricated = _fabricate_checkpoint(real_b, world)
    out.tell("prover-a answers with a decoy run's transcript; prover-b with a checkpoint fabricated to import weights")
    world.campaign(["prover-a", "prover-b"])
    _inspect_all(world, out, "prover-a")
    _inspect_all(world, out, "prover-b")
    world.wait_for_worker()
    decoy_manifest = json.loads((decoy / "claims.json").read_text())["manifest"]
    world.answer_snapshots("prover-a", real_a, manifest=decoy_manifest, location=decoy)
    world.answer_snapshots("prover-b", real_b, manifest=fabricated[1], location=fabricated[0])
    world.wait_for_worker()
    for prover, what in (("prover-a", "the decoy transcript"), ("prover-b", "the fabricated checkpoint")):
        results = _claims_summary(prover)
        out.expect(
            f"{prover}: {what} does not reproduce the logged snapshots: every claim fails",
            results and Claim.Result.VERIFIED not in results,
            f"{results}; {_describe(_alerts(world, Alert.Kind.CLAIM_FAILED, prover))[:300]}",
        )
    return out


def _fabricate_checkpoint(transcript, world: World):
    """A copy of the transcript whose checkpoint before the first logged snapshot holds other weights (imported
    from elsewhere), re-committed in a new manifest: the snapshots then follow from that checkpoint alone."""
    import safetensors.torch  # torch here, not at import: `run_scenario` itself only starts the run

    from replay.protocol.transcript_layout import checkpoint_path, sha256, write_manifest

    fake = transcript.parent / (transcript.name + "-fabricated")
    shutil.copytree(transcript, fake)
    manifest = json.loads((fake / "manifest.json").read_text())
    first = min(c["step"] for c in json.loads((fake / "claims.json").read_text())["claims"])
    step = max(int(k) for k in manifest["checkpoints"] if int(k) < first)
    path = checkpoint_path(fake, step)
    tensors = safetensors.torch.load(path.read_bytes())
    first = sorted(k for k in tensors if tensors[k].is_floating_point())[0]
    tensors[first] = tensors[first] + 0.01  # the imported weights
    path.write_bytes(safetensors.torch.save(tensors, metadata={"step": str(step)}))
    manifest["checkpoints"][str(step)] = sha256(path.read_bytes())
    return fake, write_manifest(fake, manifest)


# --- over-threshold ----------------------------------------------------------------------------------
def over_threshold(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    chips = world.fabricate(3)
    world.sell(chips, "prover-a")
    transcript = world.train("prover-a", chips, seed=3)
    flops = json.loads((transcript / "manifest.json").read_text())["reported_flops"]
    rule = flops / 4
    world.campaign(["prover-a"], rule_flops=rule)
    out.tell(
        f"the campaign's rule forbids runs of {rule:.3g} FLOPs; prover-a honestly trained one of about {flops:.3g}"
    )
    _inspect_all(world, out, "prover-a")
    world.wait_for_worker()
    claims = world.answer_snapshots("prover-a", transcript)
    world.wait_for_worker()
    results = _claims_summary("prover-a")
    out.expect(
        "every claim replays, and breaks the rule: rule_violated",
        claims and results == {Claim.Result.RULE_VIOLATED: len(claims)},
        f"{results}; {_describe(_alerts(world, Alert.Kind.CLAIM_FAILED, 'prover-a'))[:300]}",
    )
    return out


# --- diverted ----------------------------------------------------------------------------------------
def diverted(world: World) -> Outcome:
    out = Outcome()
    world.standard()
    front = world.organisation("front-ae", "AE", ["owner"], datacentre=True)
    world.organisation("buyer-cn", "CN", ["owner"], datacentre=True)
    registry.facility_register(
        owner=front, slug="da-front-ae-cn", kind="datacentre", country="CN", location="CN", actor="front-ae"
    )
    chips = world.fabricate(4)
    world.event("vendor-us", "exported", chips, consignee="front-ae", reference="SO-F", export_licence="US-EL-7")
    world.event("vendor-us", "transfer_offered", chips, to_owner="front-ae")
    world.event("front-ae", "transfer_accepted", chips)
    out.tell("vendor-us exported 4 chips under a licence for AE to front-ae, a front company in AE")
    # Licensed for AE, two are received at the front's own data centre in CN: the receipt must raise an alert.
    world.event("front-ae", "received", chips[:2], facility="da-front-ae-cn")
    flagged = [a for a in world.alerts(Alert.Kind.DIVERTED, "front-ae") if all(c in a.detail for c in chips[:2])]
    out.tell("front-ae received two of them at its data centre in CN")
    out.expect(
        "a receipt in another country than the licence and consignment name raises a 'diverted' alert",
        bool(flagged),
        _describe(flagged),
    )
    world.event("front-ae", "received", chips[2:], facility="da-front-ae")
    met, evidence = _refused(lambda: world.event("front-ae", "shipped", chips[2:], consignee="buyer-cn", reference="X"))
    out.expect("a shipment AE to CN without an export licence is refused", met and "export" in evidence, evidence)
    document = {
        "@context": ["https://ref.gs1.org/standards/epcis/2.0.0/epcis-context.jsonld"],
        "type": "EPCISDocument",
        "schemaVersion": "2.0",
        "creationDate": "2026-03-01T12:00:00Z",
        "epcisBody": {
            "eventList": [
                {
                    "type": "ObjectEvent",
                    "eventTime": "2026-03-01T10:00:00.000Z",
                    "eventTimeZoneOffset": "+04:00",
                    "epcList": [f"https://chipledger.example/chip/{s}" for s in chips[2:]],
                    "action": "OBSERVE",
                    "bizStep": "shipping",
                    "bizTransactionList": [{"type": "po", "bizTransaction": "urn:po:77"}],
                    "destinationList": [{"type": "possessing_party", "destination": "buyer-cn"}],
                }
            ]
        },
    }
    met, evidence = _refused(
        lambda: registry.epcis_capture(
            organisation=front, events=registry.epcis_document_parse(document), submission=None
        )
    )
    out.expect("the same move through EPCIS (no licence) is refused", met and "export" in evidence, evidence)
    out.tell("front-ae tried to move the other two on to buyer-cn in CN without a licence, by the API and by EPCIS")
    met, evidence = _refused(
        lambda: world.event(
            "front-ae", "shipped", chips[2:], consignee="buyer-cn", reference="Y", destination_country="AE"
        )
    )
    out.expect("a shipment to CN declared as a delivery in AE is refused", met, evidence)
    in_cn = set(Chip.objects.filter(serial__in=chips, country="CN").values_list("serial", flat=True))
    out.expect(
        "every chip the registry places in CN is under a 'diverted' alert",
        all(any(serial in a.detail for a in flagged) for serial in in_cn),
        str(dict(Chip.objects.filter(serial__in=chips).values_list("serial", "country"))),
    )
    return out


def _refused(action: Callable[[], object]) -> tuple[bool, str]:
    try:
        action()
    except ValidationError as error:
        return True, "; ".join(error.messages)
    return False, "accepted"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[World], Outcome]


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("honest", "an honest prover: every link holds, every claim verifies, no alert", honest),
        Scenario("hidden-chips", "training on chips whose receipt was never recorded", hidden_chips),
        Scenario("forged-log", "a log line not signed by the chip, and a log with a line deleted", forged_log),
        Scenario("no-claim", "logged snapshots left unexplained past the deadline", no_claim),
        Scenario(
            "spoofed-transcript",
            "a transcript that does not reproduce the snapshot; a fabricated checkpoint",
            spoofed_transcript,
        ),
        Scenario("over-threshold", "an honest transcript whose compute breaks the rule", over_threshold),
        Scenario("diverted", "chips moved through a front company to another country without a licence", diverted),
    ]
}
