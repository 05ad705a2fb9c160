"""Hostile snapshot logs through the inspections services: refused at upload, or a recorded verdict — never an exception.

Each example mutates a signed firmware log (hostile values in a field, members missing or extra, lines
duplicated, dropped, swapped, cut, NUL, look-alikes, deep nesting) and runs the upload and the worker's check as
services. A log that is stored gets exactly one verdict on the ledger, judged by the checker (never the
"unchecked" fallback of a crash), and a log judged intact records only snapshots of the authentic log.
"""

import base64
import json

import pytest
from django.core.exceptions import ValidationError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inspections.models import SnapshotLog
from inspections.services import inspectors
from ledger import selectors as ledger_selectors
from replay.protocol.firmware import canonical
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, firmware_log, with_chip_key

pytestmark = pytest.mark.django_db
RESIGNED = "   "  # a blank line: the checker skips it
FIELDS = ["serial", "counter", "time", "shard", "hash", "prev", "sig"]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [None, True, 0, -1, 1.5, 2**31, 2**53, 2**60, 2**64, -(2**63), 10**400, "", "\x00", "0" * 64 + "\n"]
        + ["２０２６-11-01T00:00:00Z", "2026-02-30T00:00:00Z", "SN\u200b", "ЅN-1", "\ud800", "A" * 10_000]
        + [[], {}, [[[[[]]]]], {"serial": "x"}]
    ),
    st.integers(),
    st.text(max_size=80),
    st.floats(allow_nan=False, allow_infinity=False),
)


# Values a chip's own key may have signed (a firmware bug, a stolen key): the bounds of every numeric field.
SIGNED_EXTREMES = {
    "counter": [2**53 - 1, 2**53, 2**60, 2**63, 2**64, 10**400, -1],
    "shard": [2**31 - 1, 2**31, 2**40, 2**63, -1],
    "time": ["9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z", "2026-11-01T00:00:00Z\n"],
    "hash": ["f" * 64, "F" * 64, "0" * 63],
}


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def mutation(draw, lines: list[str], key, several: bool = True):
    """The hostile text made of the log's lines (a list of its own, changed in place).

    Lines re-signed with the chip's key carry the mark RESIGNED at the end of the text.
    """
    if not lines:
        return ""
    kinds = ["value", "drop-field", "extra-field", "line-op", "raw", "whitespace", "deep", "signed-extreme"]
    kind = draw(st.sampled_from(kinds + ["several"] * several))
    n = draw(st.integers(0, len(lines) - 1))
    try:
        record = json.loads(lines[n])
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict) and kind in ("value", "drop-field", "extra-field", "whitespace", "signed-extreme"):
        kind = "raw"  # a line already mutated out of shape
    if kind == "value":
        record[draw(st.sampled_from(FIELDS))] = draw(HOSTILE_VALUES)
    elif kind == "drop-field":
        record.pop(draw(st.sampled_from(FIELDS)), None)
    elif kind == "extra-field":
        record[draw(st.sampled_from(["extra", "Serial", "serial\x00", "ѕerial"]))] = draw(HOSTILE_VALUES)
    if kind in ("value", "drop-field", "extra-field"):
        lines[n] = json.dumps(record, ensure_ascii=draw(st.booleans()))
    elif kind == "line-op":
        op = draw(st.sampled_from(["duplicate", "drop", "swap", "cut", "reverse"]))
        if op == "duplicate":
            lines.insert(draw(st.integers(0, len(lines))), lines[n])
        elif op == "drop":
            del lines[n]
        elif op == "swap":
            m = draw(st.integers(0, len(lines) - 1))
            lines[n], lines[m] = lines[m], lines[n]
        elif op == "cut":
            lines[n] = lines[n][: draw(st.integers(0, len(lines[n])))]
        else:
            lines.reverse()
    elif kind == "raw":
        at = draw(st.integers(0, len(lines[n])))
        lines[n] = lines[n][:at] + draw(st.text(min_size=1, max_size=8)) + lines[n][at:]
    elif kind == "whitespace":
        lines[n] = json.dumps(record, indent=draw(st.sampled_from([None, 1]))).replace("\n", "")
        lines.append(draw(st.sampled_from(["", " ", "\r", "\t", "\x0b", "\x1c", "\u2028", "\u0085"])))
    elif kind == "signed-extreme":
        field = draw(st.sampled_from(sorted(SIGNED_EXTREMES)))
        record[field] = draw(st.sampled_from(SIGNED_EXTREMES[field]))
        record.pop("sig", None)
        record["sig"] = base64.b64encode(key.sign(canonical(record)).signature).decode()
        lines[n] = canonical(record).decode()
        lines.append(RESIGNED)
    elif kind == "deep":
        lines[n] = draw(st.sampled_from([deep(5_000), '{"serial": ' + deep(5_000) + "}"]))
    else:
        for _ in range(draw(st.integers(2, 4))):
            lines = draw(mutation(lines, key, several=False)).split("\n")
    return "\n".join(lines)


@pytest.fixture
def chip_task(draw):
    task = accepted(a_task("inspect-eu"))
    key = with_chip_key(task)
    lines = firmware_log(key, task.chip.serial, 4)
    authentic = [{k: json.loads(line)[k] for k in ("counter", "time", "shard", "hash")} for line in lines]
    return task, key, lines, authentic


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_log_is_refused_or_gets_one_recorded_verdict(chip_task, django_capture_on_commit_callbacks, data):
    task, key, lines, authentic = chip_task
    text = data.draw(mutation(list(lines), key), label="log")
    size = ledger_selectors.ledger_size()
    try:
        with django_capture_on_commit_callbacks(execute=False):  # the test plays the worker
            log = inspectors.snapshot_log_upload(task, task.inspection_body, text)
    except ValidationError as refused:
        assert "log" in refused.message_dict
        event("refused at upload")
        assert ledger_selectors.ledger_size() == size
        return

    status = inspectors.snapshot_log_check(log.pk)
    log.refresh_from_db()
    assert status == log.status and log.status in (SnapshotLog.Status.INTACT, SnapshotLog.Status.PROBLEMS)
    entries = ledger_selectors.entries_at(range(size, ledger_selectors.ledger_size()))
    verdicts = [e for e in entries if e["kind"] == "inspection.snapshot_log"]
    assert len(verdicts) == 1 and verdicts[0]["payload"]["log_sha256"] == log.sha256
    verdict = verdicts[0]["payload"]
    event(f"verdict {log.status}")
    assert all(problem["kind"] != "unchecked" for problem in verdict["problems"]), verdict["problems"]
    if log.status == SnapshotLog.Status.INTACT and RESIGNED not in text:  # a prefix of the authentic records
        assert verdict["snapshots"] == authentic[: len(verdict["snapshots"])]
    assert inspectors.snapshot_log_check(log.pk) == log.status  # a redelivery records nothing twice
    assert ledger_selectors.ledger_size() == size + len(entries)
