"""The chip firmware's signed snapshot log: every tamper case is reported, exactly."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as hst

from replay.protocol.firmware import (
    EPOCH,
    ZERO,
    Chip,
    Firmware,
    canonical,
    chip_key,
    public_key_b64,
    record_hash,
    verify_log,
)

SERIAL = "SIM-0007-000"


def make_log(n: int = 6, serial: str = SERIAL, seed: int = 7):
    chip = Chip(serial, 2, chip_key(seed, serial))
    lines = [chip.snapshot(EPOCH + timedelta(minutes=i), f"{i:064x}") for i in range(n)]
    return chip, lines


def kinds(problems):
    return [(p["kind"], p["line"], p["counter"]) for p in problems]


@pytest.fixture
def log():
    chip, lines = make_log()
    return chip, lines, public_key_b64(chip.key)


def test_record_format(log):
    chip, lines, _ = log
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert set(first) == {"serial", "counter", "time", "shard", "hash", "prev", "sig", "busy_ns", "flops"}
    assert first["prev"] == ZERO and second["prev"] == record_hash(first)
    assert (first["counter"], second["counter"], first["shard"], first["time"]) == (0, 1, 2, "2025-01-01T00:00:00Z")
    body = canonical({k: v for k, v in first.items() if k != "sig"})
    chip.key.verify_key.verify(body, base64.b64decode(first["sig"]))
    assert lines[0] == canonical(first).decode()


def test_intact_log_has_no_problems(log):
    _, lines, key = log
    assert verify_log(lines, key, serial=SERIAL) == []


def test_deleted_record_is_a_gap(log):
    _, lines, key = log
    assert kinds(verify_log(lines[:2] + lines[3:], key)) == [("gap", 2, 3)]
    assert kinds(verify_log(lines[1:], key)) == [("gap", 0, 1)]


def test_edited_record_is_forged_and_nothing_else(log):
    _, lines, key = log
    rec = json.loads(lines[3])
    rec["hash"] = "f" * 64
    lines[3] = canonical(rec).decode()
    assert kinds(verify_log(lines, key)) == [("forged", 3, 3)]


def test_record_signed_by_another_key_is_forged(log):
    _, lines, key = log
    _, other = make_log(seed=8)
    lines[4] = other[4]
    assert kinds(verify_log(lines, key)) == [("forged", 4, 4)]


def test_record_of_another_chip_is_forged(log):
    chip, lines, key = log
    impostor = Chip("SIM-0007-001", 2, chip.key)  # same key, other serial: only the serial check catches it
    impostor.counter, impostor.prev = 6, record_hash(json.loads(lines[5]))
    lines.append(impostor.snapshot(EPOCH + timedelta(hours=1), "0" * 64))
    assert kinds(verify_log(lines, key, serial=SERIAL)) == [("forged", 6, 6)]


def test_swapped_records_are_reordered(log):
    _, lines, key = log
    lines[2], lines[3] = lines[3], lines[2]
    assert kinds(verify_log(lines, key)) == [("reordered", 3, 2)]


def test_rolled_back_chip_reuses_counters(log):
    chip, lines, key = log
    chip.counter, chip.prev = 3, record_hash(json.loads(lines[2]))  # firmware state restored from after record 2
    lines += [chip.snapshot(EPOCH + timedelta(hours=2), "a" * 64), chip.snapshot(EPOCH + timedelta(hours=3), "b" * 64)]
    assert kinds(verify_log(lines, key)) == [("rollback", 6, 3), ("rollback", 7, 4)]


def test_forked_history_is_a_rollback(log):
    chip, lines, key = log
    chip.counter, chip.prev = 4, record_hash(json.loads(lines[2]))  # links to 2 while claiming counter 4
    lines[4:] = [chip.snapshot(EPOCH + timedelta(hours=2), "c" * 64)]
    assert kinds(verify_log(lines, key)) == [("rollback", 4, 4)]


def test_clock_going_backwards_is_a_rollback(log):
    chip, lines, key = log
    lines.append(chip.snapshot(EPOCH - timedelta(days=1), "d" * 64))
    assert kinds(verify_log(lines, key)) == [("rollback", 6, 6)]


def test_garbage_line_is_malformed_and_leaves_its_gap(log):
    _, lines, key = log
    lines[2] = lines[2][:40]
    assert kinds(verify_log(lines, key)) == [("malformed", 2, None), ("gap", 3, 3)]


def test_firmware_snapshots_at_poisson_rate():
    layout = [{"serial": f"C{i}", "start": 0, "end": 0} for i in range(4)]
    fw = Firmware(layout, seed=1, rate=0.2)
    for step in range(1, 501):
        fw.tick(step, ["0" * 64] * 4)
    per_chip = [sum(json.loads(line)["serial"] == f"C{i}" for line in fw.lines) for i in range(4)]
    assert all(60 <= n <= 140 for n in per_chip), per_chip  # 500 * (1 - e^-0.2) = 91 expected
    for i in range(4):
        mine = [line for line in fw.lines if json.loads(line)["serial"] == f"C{i}"]
        assert verify_log(mine, fw.public_keys()[f"C{i}"], serial=f"C{i}") == []


@hsettings(max_examples=300, deadline=None)
@given(
    serial=hst.text(max_size=20),
    counter=hst.integers(min_value=0, max_value=2**63),
    signed=hst.booleans(),
    extra=hst.dictionaries(hst.sampled_from(["x", "shard2"]), hst.integers(), max_size=1),
)
def test_fast_canonical_equals_json_dumps(serial, counter, signed, extra):
    import json

    from replay.protocol.firmware import canonical

    record = {
        "serial": serial,
        "counter": counter,
        "time": "2026-01-01T00:00:00Z",
        "shard": 3,
        "hash": "a" * 64,
        "prev": "0" * 64,
        **({"sig": "QUJD" * 22} if signed else {}),
        **extra,
    }
    assert canonical(record) == json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signed_line(chip: Chip, **fields) -> str:
    """A record the chip's own key signs, with any field values: out-of-range values must still be refused."""
    rec = {"serial": chip.serial, "counter": 0, "time": "2025-01-01T00:00:00Z", "shard": 0, "hash": ZERO, "prev": ZERO}
    rec.update(fields)
    rec["sig"] = base64.b64encode(chip.key.sign(canonical(rec)).signature).decode()
    return canonical(rec).decode()


@pytest.mark.parametrize(
    "fields",
    [{"counter": 2**60}, {"counter": 2**53}, {"shard": 2**40}, {"shard": 2**31}, {"serial": "S" * 65}, {"counter": -1}],
)
def test_out_of_range_fields_of_an_authentic_record_are_malformed(fields):
    """Signed by the chip's key or not: a value the ledger or the database cannot hold is a malformed line."""
    chip, lines = make_log(2)
    problems = verify_log([*lines, signed_line(chip, **fields)], public_key_b64(chip.key), serial=SERIAL)
    assert [(p["kind"], p["line"], p["counter"]) for p in problems] == [("malformed", 2, None)]


@given(counter=hst.integers(), shard=hst.integers())
@hsettings(max_examples=200, deadline=None)
def test_a_parsed_record_is_always_within_bounds(counter, shard):
    from replay.protocol.firmware import MAX_COUNTER, MAX_SHARD, parse_record

    line = json.dumps(
        {"serial": SERIAL, "counter": counter, "time": "2025-01-01T00:00:00Z", "shard": shard}
        | {"hash": ZERO, "prev": ZERO, "sig": base64.b64encode(bytes(64)).decode()}
    )
    try:
        rec = parse_record(line)
    except ValueError:
        assert not (0 <= counter <= MAX_COUNTER and 0 <= shard <= MAX_SHARD)
    else:
        assert 0 <= rec["counter"] <= MAX_COUNTER and 0 <= rec["shard"] <= MAX_SHARD


def test_work_counters_are_signed_monotonic_and_optional():
    """Issue #19 case 4: the firmware counts busy time and FLOPs in monotonic counters every signed snapshot
    carries; a counter that goes down is a rollback; firmware that does not count omits both fields."""
    from replay.protocol.firmware import parse_record

    chip = Chip(SERIAL, 0, chip_key(1, SERIAL))
    lines = []
    for i in range(4):
        chip.work(2.5, 1000 * (i + 1))
        lines.append(chip.snapshot(EPOCH + timedelta(minutes=i), f"{i:064x}"))
    recs = [parse_record(line) for line in lines]
    assert [r["flops"] for r in recs] == [1000, 3000, 6000, 10000]
    assert [r["busy_ns"] for r in recs] == [2_500_000_000 * (i + 1) for i in range(4)]
    assert verify_log(lines, public_key_b64(chip.key)) == []
    chip.flops -= 5000  # a chip whose counter was reset: the signed record shows it
    lines.append(chip.snapshot(EPOCH + timedelta(minutes=9), "ab" * 32))
    assert [p["kind"] for p in verify_log(lines, public_key_b64(chip.key))] == ["rollback"]
    silent = Chip(SERIAL, 0, chip_key(1, SERIAL), busy_ns=None, flops=None)
    silent.work(1.0, 10)
    assert "flops" not in json.loads(silent.snapshot(EPOCH, "00" * 32))
    one = json.loads(lines[0])
    del one["busy_ns"]
    with pytest.raises(ValueError, match="both"):
        parse_record(json.dumps(one))
    huge = {**json.loads(lines[0]), "flops": 2**128}
    with pytest.raises(ValueError, match="flops"):
        parse_record(json.dumps(huge))


def test_a_log_line_with_an_over_long_integer_is_no_record_not_a_crash():
    """Python's JSON refuses an integer of over 4300 digits with a ValueError of its own, not a JSONDecodeError."""
    from replay.protocol.firmware import parse_record

    with pytest.raises(ValueError, match="not JSON") as refused:
        parse_record('{"counter": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError) as python_says:
        json.loads("9" * 5000)
    whole = str(python_says.value)
    shown = str(refused.value).removeprefix("not JSON: ")
    assert len(whole) > 120 and shown.endswith("...")  # cut, and said to be
    kept = shown.removesuffix("...")
    assert whole.startswith(kept) and whole[len(kept)] == " "  # after a whole word


@given(text=hst.text(alphabet="ab ", max_size=400) | hst.text(max_size=400), limit=hst.integers(1, 200))
@hsettings(max_examples=500, deadline=None)
def test_a_cut_message_keeps_whole_words_within_the_limit(text, limit):
    from replay.protocol.firmware import _cut

    cut = _cut(text, limit)
    if len(text) <= limit:
        assert cut == text
    else:
        kept = cut.removesuffix("...")
        assert cut.endswith("...") and len(kept) <= limit and text.startswith(kept)
        # after a whole word, or, with no space to cut at past the first character, at the limit
        assert text[len(kept)] == " " or (kept == text[:limit] and " " not in text[1 : limit + 1])


def respelled(text: str) -> str:
    """The same bytes in another base64 spelling: the last data character's lowest spare bit set."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body = text.rstrip("=")
    last = alphabet[alphabet.index(body[-1]) | 1]
    out = body[:-1] + last + text[len(body) :]
    assert out != text and base64.b64decode(out, validate=True) == base64.b64decode(text)
    return out


def test_a_signature_in_a_second_base64_spelling_is_malformed_not_a_second_authentic_record(log):
    """base64 lets a signature's last character carry set spare bits: the same signature, another record text, so
    another record hash, which breaks the next record's link (an honest chip's log then read as rolled back). Only the
    spelling the firmware writes is a record."""
    _, lines, key = log
    rec = json.loads(lines[2])
    rec["sig"] = respelled(rec["sig"])
    lines[2] = canonical(rec).decode()
    problems = verify_log(lines, key, serial=SERIAL)
    assert kinds(problems)[0] == ("malformed", 2, None)
    assert "canonical base64" in problems[0]["detail"]


def test_a_chip_key_in_a_second_base64_spelling_is_refused(log):
    from replay.protocol.snapshot_logs import check_keys
    from replay.protocol.transcript_errors import MalformedTranscript

    _, _, key = log
    assert check_keys({SERIAL: key}) == {SERIAL: key}
    with pytest.raises(MalformedTranscript, match="canonical base64"):
        check_keys({SERIAL: respelled(key)})
    # the server's checker takes a key's bytes (its spelling is in no record's hash): the registry's as filed
    chip, lines = make_log(3)
    assert verify_log(lines, respelled(public_key_b64(chip.key)), serial=SERIAL) == []


def test_a_record_naming_a_member_twice_is_malformed_whichever_copy_is_signed():
    """`{"hash": forged, ..., "hash": signed}` verified under Python's last-wins parser, and was forged to a parser that
    keeps the first: one line, two verdicts. Now malformed to every reader, naming the member."""
    chip, lines = make_log(3)
    signed = json.loads(lines[2])
    forged = '{"hash":"' + "f" * 64 + '",' + lines[2][1:]  # the signed hash stays, last
    second = lines[2][:-1] + ',"hash":"' + "f" * 64 + '"}'  # the forged one last
    for line in (forged, second):
        problems = verify_log([*lines[:2], line], public_key_b64(chip.key), serial=SERIAL)
        assert kinds(problems) == [("malformed", 2, None)]
        assert "'hash' appears twice" in problems[0]["detail"]
    assert verify_log(lines, public_key_b64(chip.key), serial=SERIAL) == [] and signed["counter"] == 2


@given(hst.lists(hst.text(alphabet=hst.characters(blacklist_characters="\n\r")), max_size=5), hst.booleans())
def test_log_lines_split_as_json_lines_readers_do(lines, crlf):
    """At "\\n" alone (a CRLF's "\\r" dropped), whatever other line breaks a line holds; no line after the last "\\n"."""
    from replay.protocol.firmware import log_lines

    end = "\r\n" if crlf else "\n"
    assert log_lines("".join(line + end for line in lines)) == lines
    assert log_lines(end.join(lines)) == (lines[:-1] if lines[-1:] == [""] else lines)  # (a last empty line is none)


def test_records_joined_by_another_line_break_are_one_malformed_line():
    """Three signed records joined by "\\n", "\\x1e": str.splitlines saw three authentic records, a JSON Lines reader two
    lines, one of them no record. Now every reader sees the second line malformed (and the third record's gap)."""
    from replay.protocol.firmware import log_lines

    chip, lines = make_log(3)
    text = lines[0] + "\n" + lines[1] + "\x1e" + lines[2] + "\n"
    assert len(text.splitlines()) == 3 and len(log_lines(text)) == 2
    problems = verify_log(log_lines(text), public_key_b64(chip.key), serial=SERIAL)
    assert kinds(problems) == [("malformed", 1, None)]


def test_a_log_with_lone_carriage_returns_is_one_malformed_line_that_says_why():
    """Lines ended by "\\r" alone (an old Mac's) are one line to a JSON Lines reader: malformed, the reason named."""
    from replay.protocol.firmware import log_lines

    chip, lines = make_log(3)
    problems = verify_log(log_lines("\r".join(lines) + "\r"), public_key_b64(chip.key), serial=SERIAL)
    assert kinds(problems) == [("malformed", 0, None)]
    assert "lines end at \\n alone, not \\r" in problems[0]["detail"]
