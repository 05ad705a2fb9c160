"""The command line's arguments (python -m replay record|claim|verify): a bad one exits 2 naming it, before
anything is written (no transcript, no chip log touched), and never reads as a verdict against the prover."""

from __future__ import annotations

import base64
import json
import math
import os
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.__main__ import main
from replay.protocol import manifest_schema as schema
from replay.prover import chipsim
from replay.prover.recorder import MAX_SNAPSHOT_RATE, check_options

TINY_MLP = ["--arch", "mlp", "--config", '{"sizes": [8, 8, 4]}', "--batch", "4"]


def record(out, *extra) -> int:
    return main(["record", *TINY_MLP, "--out", str(out), *extra])


def verify(d, *extra) -> int:
    return main(["verify", str(d), "--claims", str(d / "claims.json"), "--json", "--nonce", "00" * 16, *extra])


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "the verifier failed" not in err
    return err


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """A tiny run on two registered chips (the simulator's keys), logging at nearly every step."""
    base = tmp_path_factory.mktemp("cli")
    store = chipsim.ChipStore(base / "chips")
    store.make("H1")
    store.make("H2")
    out = base / "run"
    chips = ["--chip-dir", str(base / "chips"), "--serials", "H1,H2", "--snapshot-rate", "5"]
    assert record(out, "--steps", "3", *chips) == 0
    return out


# --- record ------------------------------------------------------------------------------------------


def test_the_default_checkpoint_interval_adapts_to_a_short_run_and_the_transcript_verifies(tmp_path, capsys):
    out = tmp_path / "t"
    assert record(out, "--steps", "5") == 0
    assert json.loads((out / "manifest.json").read_text())["checkpoint_interval"] == 5
    capsys.readouterr()
    assert verify(out) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--steps", "5", "--checkpoint-interval", "10"], "--checkpoint-interval must be an integer in [1, 5]"),
        (["--steps", "2", "--checkpoint-interval", "0"], "--checkpoint-interval must be an integer in [1, 2]"),
        (["--steps", "2", "--checkpoint-interval", "-1"], "--checkpoint-interval"),
        (["--steps", "0"], f"--steps must be an integer in [1, {schema.MAX_STEPS}]"),
        (["--steps", str(schema.MAX_STEPS + 1)], "--steps"),
        (
            ["--steps", "1", "--batch", str(schema.MAX_BATCH + 1)],
            f"--batch must be an integer in [1, {schema.MAX_BATCH}]",
        ),
        (["--steps", "1", "--batch", "0"], "--batch"),
        (["--steps", "1", "--chips", "0"], f"--chips must be an integer in [1, {schema.MAX_SHARDS}]"),
        (["--steps", "1", "--chips", "-3"], "--chips"),
        (["--steps", "1", "--chips", "100000000"], "--chips"),
        (["--steps", "1", "--seed", str(2**64)], f"--seed must be an integer in [0, {schema.MAX_SEED}]"),
        (["--steps", "1", "--seed", "-1"], "--seed"),
        (["--steps", "1", "--snapshot-rate", "nan"], "--snapshot-rate must be a number in [0, "),
        (["--steps", "1", "--snapshot-rate", "inf"], "--snapshot-rate"),
        (["--steps", "1", "--snapshot-rate", "-1"], "--snapshot-rate"),
        (["--steps", "1", "--snapshot-rate", str(MAX_SNAPSHOT_RATE * 2)], "--snapshot-rate"),
    ],
)
def test_record_refuses_what_a_verifier_would_call_malformed_naming_the_option(argv, named, tmp_path, capsys):
    out = tmp_path / "t"
    assert record(out, *argv) == 2
    err = _error(capsys)
    assert named in err and "usage:" in err
    assert not out.exists()


def test_an_explicit_interval_within_the_run_is_kept(tmp_path):
    out = tmp_path / "t"
    assert record(out, "--steps", "4", "--checkpoint-interval", "2") == 0
    assert json.loads((out / "manifest.json").read_text())["checkpoint_interval"] == 2


@settings(max_examples=200, deadline=None)
@given(
    steps=st.integers(-5, schema.MAX_STEPS + 5),
    interval=st.integers(-5, 50),
    batch=st.integers(-5, schema.MAX_BATCH + 5),
    seed=st.integers(-5, 2**64),
    chips=st.integers(-5, schema.MAX_SHARDS + 5),
    rate=st.floats(allow_nan=True, allow_infinity=True),
)
def test_the_options_record_takes_are_exactly_those_the_manifest_schema_takes(
    steps, interval, batch, seed, chips, rate
):
    """One source of truth: record accepts an option iff the verifier's schema bounds accept what it writes."""
    inside = (
        1 <= steps <= schema.MAX_STEPS
        and 1 <= interval <= steps
        and 1 <= batch <= schema.MAX_BATCH
        and 0 <= seed <= schema.MAX_SEED
        and 1 <= chips <= schema.MAX_SHARDS
        and math.isfinite(rate)
        and 0 <= rate <= MAX_SNAPSHOT_RATE
    )
    try:
        check_options(steps, interval, batch, seed, chips, rate)
    except ValueError as e:
        assert not inside and str(e).startswith("--")
    else:
        assert inside


def test_record_refuses_an_out_that_is_a_file_or_holds_a_transcript(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("keep me")
    assert record(a_file, "--steps", "1") == 2
    assert "--out" in _error(capsys) and a_file.read_text() == "keep me"
    assert record(a_file / "under", "--steps", "1") == 2
    assert "--out" in _error(capsys)

    out = tmp_path / "t"
    assert record(out, "--steps", "2") == 0
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert record(out, "--steps", "1", "--seed", "3") == 2
    assert "already holds" in _error(capsys)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing mixed in

    empty = tmp_path / "empty"
    empty.mkdir()
    assert record(empty, "--steps", "1") == 0  # an empty folder is a new one


def test_a_repeated_serial_is_refused_before_any_chip_log_is_touched(tmp_path, capsys):
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    assert (
        record(
            tmp_path / "a",
            "--steps",
            "2",
            "--chip-dir",
            str(tmp_path / "chips"),
            "--serials",
            "H1",
            "--snapshot-rate",
            "5",
        )
        == 0
    )
    capsys.readouterr()
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "chips").iterdir())
    out = tmp_path / "b"
    chips = ["--chip-dir", str(tmp_path / "chips"), "--snapshot-rate", "5"]
    for serials, named in (
        ("H1,H1", "--serials names H1 more than once"),
        ("H1,", "empty serial"),
        ("H1,H9", "no chip H9"),
    ):
        assert record(out, "--steps", "2", *chips, "--serials", serials) == 2
        assert named in _error(capsys)
        assert not out.exists()
        assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "chips").iterdir()) == before


def test_registered_chips_train_only_claimable_runs_and_chips_is_not_taken_beside_serials(tmp_path, capsys):
    """A plain-baseline run on registered chips would log snapshots no claim could ever answer, in logs kept for good."""
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1", "--snapshot-rate", "5"]
    out = tmp_path / "t"
    for extra, named in (
        (["--precision", "float64"], "--precision float64 is a plain baseline, not claimable"),
        (["--precision", "float32"], "--precision float32 is a plain baseline, not claimable"),
        (["--chips", "7"], "--chips counts simulated chips"),
    ):
        assert record(out, "--steps", "2", *chips, *extra) == 2
        assert named in _error(capsys)
        assert not out.exists() and sorted(p.name for p in (tmp_path / "chips").iterdir()) == ["H1.key"]


def test_an_out_or_chip_file_the_system_refuses_is_a_usage_error_naming_it(tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for out, named in (
        (tmp_path / ("x" * 300), "File name too long"),
        (tmp_path / "dangling" / "sub", "is a broken link"),
    ):
        assert record(out, "--steps", "1") == 2
        err = _error(capsys)
        assert "--out" in err and named in err
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    (tmp_path / "chips" / "H1.log").mkdir()  # a folder where the chip's log would be
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1"]
    assert record(tmp_path / "t", "--steps", "1", *chips) == 2
    assert "chip H1: cannot read H1.log" in _error(capsys) and not (tmp_path / "t").exists()
    assert (
        main(
            [
                "record",
                "--arch",
                "mlp",
                "--steps",
                "1",
                "--config",
                '{"sizes": [8, %s]}' % ("1" * 5000),
                "--out",
                str(tmp_path / "u"),
            ]
        )
        == 2
    )
    assert "--config holds a number too long" in _error(capsys)


STATE_REFUSED = "chip H1: its state file is not"
KEY_REFUSED = "chip H1: H1.key is not a base64 32-byte Ed25519 seed"


@pytest.mark.parametrize(
    ("file", "text", "refused"),
    [
        ("H1.state", "[" * 60_000, STATE_REFUSED),  # (nested past the parser: under the file cap)
        ("H1.state", '{"busy_ns": ' + str(2**128) + ', "flops": 1}', STATE_REFUSED),
        ("H1.state", '{"busy_ns": -5, "flops": -7}', STATE_REFUSED),
        ("H1.state", '{"busy_ns": 1e3, "flops": 1}', STATE_REFUSED),
        ("H1.key", "not base64!", KEY_REFUSED),
        ("H1.key", "AAAA", KEY_REFUSED),
        ("H1.key", base64.b64encode(bytes(31)).decode(), KEY_REFUSED),
        ("H1.key", "\x00", KEY_REFUSED),
    ],
)
def test_a_chip_file_out_of_range_or_unreadable_is_refused_naming_the_chip_before_any_log_is_signed(
    file, text, refused, tmp_path, capsys
):
    """The firmware would sign its counters into the chip's log for good: out of the range a verifier reads, never;
    and a key that is no Ed25519 seed is the chip's problem, said so (binascii's and nacl's messages name neither)."""
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    (tmp_path / "chips" / file).write_text(text)
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1"]
    assert record(tmp_path / "t", "--steps", "1", *chips) == 2
    assert refused in _error(capsys)
    assert not (tmp_path / "t").exists() and not (tmp_path / "chips" / "H1.log").exists()


@pytest.mark.parametrize("file", ["H1.key", "H1.state", "H1.log"])
def test_a_chip_file_that_is_no_regular_file_is_refused_naming_it(file, tmp_path, capsys):
    """A link to a device (/dev/zero would be read without end; /dev/null here, which ends) or a FIFO (whose open
    waits for a writer for ever) in the chip folder is refused by name, and nothing is signed."""
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    (tmp_path / "chips" / file).unlink(missing_ok=True)
    (tmp_path / "chips" / file).symlink_to("/dev/null")
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1"]
    assert record(tmp_path / "t", "--steps", "1", *chips) == 2
    assert f"chip H1: {file} is not a regular file" in _error(capsys)
    assert not (tmp_path / "t").exists()
    (tmp_path / "chips" / file).unlink()
    os.mkfifo(tmp_path / "chips" / file)
    said = []

    def read():
        try:
            store.firmware_chip("H1", 0)
        except ValueError as e:
            said.append(str(e))

    reader = threading.Thread(target=read, daemon=True)  # (a regression waits in open(): the test fails, not hangs)
    reader.start()
    reader.join(30)
    assert said == [f"chip H1: {file} is not a regular file"]


@pytest.mark.parametrize("file", ["H1.key", "H1.state", "H1.log"])
def test_a_chip_file_larger_than_a_chips_is_refused_naming_it(file, tmp_path, capsys, monkeypatch):
    """A chip's key or state is a line and its log a lifetime of records: a file past that (a stray multi-GB file in
    the chip folder) is refused by name, read no further, and nothing is signed."""
    monkeypatch.setattr(chipsim, "LOG_FILE", 1 << 20)  # (the test's log: 1 MiB, not the real 1 GiB)
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    most = chipsim.LOG_FILE if file.endswith(".log") else chipsim.SMALL_FILE
    (tmp_path / "chips" / file).write_text("x" * (most + 1))
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1"]
    assert record(tmp_path / "t", "--steps", "1", *chips) == 2
    assert f"chip H1: {file} holds over {most:,} characters" in _error(capsys)
    assert not (tmp_path / "t").exists()


def test_a_run_over_the_budget_is_refused_before_its_dataset_is_made(tmp_path, capsys, monkeypatch):
    from replay.prover import recorder

    def made(*args, **kwargs):
        raise AssertionError("the dataset was made before the budget was checked")

    monkeypatch.setattr(recorder.data, "Batches", made)
    monkeypatch.setenv("REPLAY_MEMORY_BUDGET_BYTES", "64")
    assert record(tmp_path / "t", "--steps", "1") == 2
    assert "REPLAY_MEMORY_BUDGET_BYTES" in _error(capsys) and not (tmp_path / "t").exists()


def test_the_chip_simulator_refuses_a_repeated_serial_and_an_occupied_out(tmp_path, capsys):
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    with pytest.raises(ValueError, match="more than once"):
        store.train(["H1", "H1"], tmp_path / "t", steps=2, snapshot_rate=5.0)
    assert not (tmp_path / "t").exists() and not (tmp_path / "chips" / "H1.log").exists()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "manifest.json").write_text("{}")
    argv = ["--dir", str(tmp_path / "chips"), "train", "--chips", "H1", "--out", str(tmp_path / "t"), "--steps", "2"]
    assert chipsim.main(argv) == 2
    assert "already holds manifest.json" in capsys.readouterr().err


# --- claim -------------------------------------------------------------------------------------------


def test_claim_refuses_a_folder_out_and_a_malformed_claims_file_naming_them(honest, tmp_path, capsys):
    assert main(["claim", str(honest), "--out", str(tmp_path)]) == 2
    assert f"--out {tmp_path} is a folder" in _error(capsys)
    bad = tmp_path / "bad"
    bad.mkdir()
    for claims, named in (
        ({"manifest": "ab", "claims": [1]}, "claims[0] is not a recorded claim"),
        ({"manifest": "ab", "claims": [{"serial": "H1", "counter": -1, "step": 1}]}, "claims[0]"),
        ({"manifest": 5, "claims": []}, "manifest"),
    ):
        (bad / "claims.json").write_text(json.dumps(claims))
        assert main(["claim", str(bad)]) == 2
        assert named in _error(capsys)


def test_claim_on_a_run_that_logged_nothing_says_why_instead_of_an_empty_body(tmp_path, capsys):
    out = tmp_path / "t"
    assert record(out, "--steps", "1", "--snapshot-rate", "0") == 0
    recorded = json.loads((out / "claims.json").read_text())
    assert {c["step"] for c in recorded["claims"]} == {1}  # no random snapshot: only the run's closing ones
    # firmware that logged nothing (no closing snapshot either): nothing to claim
    (out / "claims.json").write_text(json.dumps({**recorded, "claims": []}))
    capsys.readouterr()
    assert main(["claim", str(out), "--out", str(tmp_path / "body.json")]) == 2
    assert "logged no snapshot" in _error(capsys) and not (tmp_path / "body.json").exists()


# --- verify ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-flops", "nan"],
        ["--max-flops", "inf"],
        ["--max-flops", "0"],
        ["--max-flops", "-1e26"],
        ["--max-seconds", "nan"],
        ["--max-seconds", "-1"],
        ["--max-seconds", "0"],
        ["--max-steps", "0"],
        ["--segments", "-5"],
    ],
)
def test_verify_refuses_a_bad_budget_as_a_usage_error_never_a_verdict(argv, honest, capsys):
    with pytest.raises(SystemExit) as exit_:
        verify(honest, *argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert argv[0] in captured.err and "verdict" not in captured.out  # nothing a worker would take as a verdict


def _claims(honest, edit) -> dict:
    claims = json.loads((honest / "claims.json").read_text())
    edit(claims)
    return claims


@pytest.mark.parametrize(
    "edit,reason",
    [
        (lambda d: d["claims"][0].update(counter=-1), "claims[0].counter must be an integer in [0, "),
        (lambda d: d["claims"].extend(d["claims"]), "repeats claims[0]"),
        (lambda d: d["claims"].__setitem__(slice(None), d["claims"] * 600), "repeats claims[0]"),
    ],
)
def test_negative_counters_and_repeated_claims_are_malformed(edit, reason, honest, tmp_path, capsys):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(_claims(honest, edit)))
    assert main(["verify", str(honest), "--claims", str(path), "--json", "--nonce", "00" * 16]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "malformed" and reason in out["reasons"][0]


@pytest.mark.parametrize(
    "text,reason",
    [
        (lambda c: c.replace('"counter": 0', '"counter": ' + "9" * 5000, 1), "claims is not readable JSON"),
        (
            lambda c: json.dumps({**json.loads(c), "claims": [{**json.loads(c)["claims"][0], "serial": ["x"]}]}),
            "wrong type",
        ),
        (
            lambda c: json.dumps({**json.loads(c), "claims": [{**json.loads(c)["claims"][0], "serial": {}}]}),
            "wrong type",
        ),
    ],
)
def test_an_over_long_number_or_a_serial_that_is_no_string_is_malformed(text, reason, honest, tmp_path, capsys):
    path = tmp_path / "claims.json"
    path.write_text(text(json.dumps(json.loads((honest / "claims.json").read_text()))))
    assert main(["verify", str(honest), "--claims", str(path), "--json", "--nonce", "00" * 16]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "malformed" and reason in out["reasons"][0], out["reasons"]


@pytest.mark.parametrize("keys", ["null", "false", "0", '""', "[]"])
def test_a_keys_file_that_is_no_object_is_malformed_even_when_falsy(keys, honest, tmp_path, capsys):
    path = tmp_path / "keys.json"
    path.write_text(keys)
    assert verify(honest, "--snapshots", str(honest / "snapshots.jsonl"), "--keys", str(path)) == 2
    assert "chip keys must be an object" in json.loads(capsys.readouterr().out)["reasons"][0]


def test_a_claims_manifest_that_is_no_string_is_malformed(honest, tmp_path, capsys):
    path = tmp_path / "claims.json"
    path.write_text(json.dumps(_claims(honest, lambda d: d.update(manifest=5))))
    assert main(["verify", str(honest), "--claims", str(path), "--json", "--nonce", "00" * 16]) == 2
    assert "claims.manifest must be" in json.loads(capsys.readouterr().out)["reasons"][0]


def test_a_claims_file_is_read_no_further_than_its_cap(honest, tmp_path, monkeypatch, capsys):
    from replay.protocol import claims_file

    monkeypatch.setattr(claims_file, "READ_MAX", 1 << 10)
    assert main(["verify", str(honest), "--claims", "/dev/zero", "--json", "--nonce", "00" * 16]) == 2
    assert "claims is not readable JSON" in json.loads(capsys.readouterr().out)["reasons"][0]


def test_the_claims_api_body_handed_to_verify_is_named(honest, tmp_path, capsys):
    body = tmp_path / "body.json"
    assert main(["claim", str(honest), "--out", str(body)]) == 0
    capsys.readouterr()
    assert main(["verify", str(honest), "--claims", str(body), "--json", "--nonce", "00" * 16]) == 2
    reason = json.loads(capsys.readouterr().out)["reasons"][0]
    assert "claims API's body" in reason and "claims.json" in reason


@pytest.mark.parametrize("keys", [{"H1": "!!"}, {"H1": 5}, {"H1": "AAAA"}])
def test_a_chip_key_that_is_no_key_is_malformed_not_a_rejection(keys, honest, tmp_path, capsys):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(keys))
    snapshots = ["--snapshots", str(honest / "snapshots.jsonl"), "--keys", str(path)]
    assert verify(honest, *snapshots) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "malformed" and "chip keys['H1']" in out["reasons"][0]
    assert verify(honest, "--snapshots", str(honest / "snapshots.jsonl")) == 0  # its own keys: verified


def test_the_exit_codes_the_readme_lists_are_the_ones_verify_returns():
    """README.md and docs/transcripts.md list every exit status of verify (incomplete's 4 included)."""
    from pathlib import Path

    from replay.__main__ import EXIT

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    for verdict, code in EXIT.items():
        assert f"{code} {verdict}" in readme, verdict
        assert f"| `{verdict}` | {code} |" in (root / "docs" / "transcripts.md").read_text()


def _verdict(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_a_second_honest_run_on_the_same_chips_verifies_with_its_logs(tmp_path, capsys):
    """A run's snapshots file holds that run's records, and a chip's second run starts past counter 0: checked from 0,
    every honest second run had "N record(s) missing among counters 0..N-1" and was rejected. A record deleted from
    inside the run's excerpt is still a gap; a claim's time in another spelling of the logged instant is that time."""
    store = chipsim.ChipStore(tmp_path / "chips")
    for serial in ("P1", "P2"):
        store.make(serial)
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "P1,P2", "--snapshot-rate", "2"]
    assert record(tmp_path / "r1", "--steps", "3", *chips) == 0
    assert record(tmp_path / "r2", "--steps", "3", "--seed", "5", *chips) == 0
    second = tmp_path / "r2"
    lines = (second / "snapshots.jsonl").read_text().splitlines()
    assert min(json.loads(line)["counter"] for line in lines) > 0  # the chips' second run
    capsys.readouterr()
    assert verify(second, "--snapshots", str(second / "snapshots.jsonl")) == 0, capsys.readouterr().out
    said = _verdict(capsys)
    assert said["verdict"] == "verified", said["reasons"]
    claims = json.loads((second / "claims.json").read_text())
    claims["claims"][0]["time"] = claims["claims"][0]["time"][:-1] + ".000Z"  # the same instant
    (second / "claims.json").write_text(json.dumps(claims))
    assert verify(second, "--snapshots", str(second / "snapshots.jsonl")) == 0, capsys.readouterr().out
    capsys.readouterr()
    p1 = [line for line in lines if json.loads(line)["serial"] == "P1"]
    assert len(p1) >= 3
    (second / "snapshots.jsonl").write_text("\n".join(line for line in lines if line != p1[1]) + "\n")
    assert verify(second, "--snapshots", str(second / "snapshots.jsonl")) == 1
    reasons = _verdict(capsys)["reasons"]
    assert any("chip P1: gap" in r and "1 record(s) missing" in r for r in reasons), reasons


def test_keys_without_snapshots_are_refused_as_an_argument_that_checks_nothing(tmp_path, capsys, honest):
    """--keys checks the chips' logs; given without --snapshots it checked nothing (a garbage file: verified)."""
    (tmp_path / "keys.json").write_text("garbage")
    assert verify(honest, "--keys", str(tmp_path / "keys.json")) == 2
    said = _verdict(capsys)
    assert said["verdict"] == "malformed" and said["reasons"] == ["--keys checks the chips' logs: give --snapshots"]


def test_claim_reads_the_transcripts_claims_as_the_verifier_does(tmp_path, capsys):
    """`claim` read claims.json whole and parsed it unguarded: nesting gave a RecursionError traceback, a FIFO hung."""
    (tmp_path / "claims.json").write_text("[" * 200_000 + "]" * 200_000)
    assert main(["claim", str(tmp_path)]) == 2
    assert "is not readable JSON (RecursionError)" in _error(capsys)
    (tmp_path / "claims.json").unlink()
    os.mkfifo(tmp_path / "claims.json")
    said = []
    runner = threading.Thread(target=lambda: said.append(main(["claim", str(tmp_path)])), daemon=True)
    runner.start()
    runner.join(30)  # (a regression waits in open(): the test fails, not hangs)
    assert said == [2] and "claims.json is a pipe that gave nothing to read" in _error(capsys)


def test_a_chip_whose_last_log_line_is_no_record_is_named(tmp_path, capsys):
    """The firmware goes on from the chip's last record; where that line is cut or respelled the error names the
    chip and its log, where it had been the parser's words alone."""
    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("H1")
    chips = ["--chip-dir", str(tmp_path / "chips"), "--serials", "H1", "--snapshot-rate", "2"]
    assert record(tmp_path / "t1", "--steps", "2", *chips) == 0
    log = tmp_path / "chips" / "H1.log"
    log.write_text(log.read_text()[:-20] + "\n")  # the last record cut short
    capsys.readouterr()
    assert record(tmp_path / "t2", "--steps", "2", *chips) == 2
    assert "chip H1: the last line of H1.log is no record (not JSON" in _error(capsys)
    assert not (tmp_path / "t2").exists()


def test_a_plain_precision_run_is_a_baseline_that_verify_and_claim_refuse_by_name(tmp_path, capsys):
    """record --precision float64 had said "a verifier can replay this run", claim answered with it, and its
    manifest was refused as "not claimable: only det64..." by the schema without saying what to do."""
    out = tmp_path / "f64"
    assert record(out, "--steps", "2", "--precision", "float64") == 0
    assert "a float64 run is a plain baseline for benchmarks: no verifier replays it" in _error(capsys)
    assert verify(out) == 2
    said = _verdict(capsys)
    assert said["verdict"] == "malformed" and said["reasons"][0].startswith("precision 'float64' is not claimable")
    assert said["reasons"][0].endswith("record with precision det64")
    assert main(["claim", str(out)]) == 2
    assert "was recorded in 'float64', a plain baseline for benchmarks" in _error(capsys)
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "precision": "float16"}))
    assert verify(out) == 2
    assert _verdict(capsys)["reasons"] == ["precision must be one of det64, float32, float64, not 'float16'"]


def test_a_fifo_that_no_process_writes_is_malformed_not_an_empty_log(honest, tmp_path, capsys):
    """A FIFO given as --snapshots read as an empty log: every claim "has no logged snapshot", a rejection of the
    prover for the verifier's slip. A pipe a process writes (--claims <(...)) is still read."""
    os.mkfifo(tmp_path / "log")
    said = []
    runner = threading.Thread(target=lambda: said.append(verify(honest, "--snapshots", str(tmp_path / "log"))))
    runner.start()
    runner.join(30)
    assert said == [2]
    assert _verdict(capsys)["reasons"] == [
        f"snapshots {tmp_path / 'log'} is a pipe that gave nothing to read (a FIFO that no process writes?)"
    ]
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, (honest / "claims.json").read_bytes()), os.close(write)))
    writer.start()
    try:
        assert verify(honest, "--claims", f"/dev/fd/{read}") == 0
    finally:
        writer.join(30)
        os.close(read)
    assert _verdict(capsys)["verdict"] == "verified"


def test_a_verdict_shows_its_first_hundred_reasons_and_counts_the_rest(honest, tmp_path, capsys):
    """A snapshots file of noise gave a reason a line: 261,703 of them, 29 MB of output."""
    (tmp_path / "noise").write_text("x\n" * 500)
    assert verify(honest, "--snapshots", str(tmp_path / "noise")) == 1
    reasons = _verdict(capsys)["reasons"]
    assert len(reasons) == 100 and reasons[:2] == [
        "snapshots line 0: malformed (not JSON: Expecting value: line 1 column 1 (char 0))",
        "snapshots line 1: malformed (not JSON: Expecting value: line 1 column 1 (char 0))",
    ]
    extra = int(reasons[-1].removeprefix("... and ").removesuffix(" more reasons").replace(",", ""))
    assert extra >= 500 - 99  # every malformed line, and the claims they leave unexplained


@pytest.mark.parametrize("serials", [",", "", "H1,", ",H1", "H1,,H2"])
def test_claim_refuses_an_empty_serial_as_record_does(serials, honest, capsys):
    """A stray comma had quietly answered every chip of the run."""
    assert main(["claim", str(honest), "--serials", serials]) == 2
    assert "names an empty serial (a stray comma?)" in _error(capsys)


def test_an_out_that_is_a_link_is_named_as_one(tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert record(tmp_path / "link", "--steps", "1") == 2
    assert f"--out {tmp_path / 'link'} is a symbolic link: name the folder itself" in _error(capsys)
    assert not any((tmp_path / "real").iterdir())


def test_a_one_step_run_has_no_loss_trend_to_find(tmp_path, capsys):
    """Its first quarter is its last: every one-step run had the finding "the loss did not go down"."""
    assert record(tmp_path / "t", "--steps", "1") == 0
    capsys.readouterr()
    assert verify(tmp_path / "t") == 0
    said = _verdict(capsys)
    assert said["checks"]["loss_trend"] == {"ok": None, "steps": 1}
    assert not [f for f in said.get("findings") or [] if f["kind"] == "loss_trend"]


def test_verify_prints_strict_json_a_screens_nan_as_null(honest, capsys, monkeypatch):
    """A screen's z of a constant sample is infinite, of a non-finite loss NaN: printed as NaN and Infinity, which are
    not JSON (RFC 8259), so a strict reader of the verdict failed on it."""
    import replay.__main__ as cli

    real = cli.verify

    def with_non_finite_z(*args, **kwargs):
        verdict = real(*args, **kwargs)
        verdict.details["screen"] = {"z": {"10": float("nan"), "20": float("-inf"), "30": 1.5}, "flagged": [10, 20]}
        return verdict

    monkeypatch.setattr(cli, "verify", with_non_finite_z)
    assert verify(honest) == 0
    said = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the output"))
    assert said["verdict"] == "verified" and said["screen"] == {
        "z": {"10": None, "20": None, "30": 1.5},
        "flagged": [10, 20],
    }
