"""The chip simulator: keys that never leave its folder, identity answers, logs that carry on across runs."""

import base64
import json
import stat

import pytest
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

from replay.protocol.firmware import verify_log
from replay.prover import chipsim


def test_a_chip_makes_its_key_once_and_keeps_it_private(tmp_path):
    store = chipsim.ChipStore(tmp_path)
    public = store.make("P0001")
    assert store.make("P0001") == public  # an existing chip keeps its key
    assert stat.S_IMODE((tmp_path / "P0001.key").stat().st_mode) == 0o600
    assert base64.b64decode(public) == bytes(store.key("P0001").verify_key)


def test_the_answer_verifies_under_the_chip_key_and_only_for_its_serial_and_nonce(tmp_path):
    store = chipsim.ChipStore(tmp_path)
    key = VerifyKey(base64.b64decode(store.make("P0001")))
    signature = base64.b64decode(store.answer("P0001", "ab" * 32))
    key.verify(chipsim.identity_message("P0001", "ab" * 32), signature)
    with pytest.raises(BadSignatureError):
        key.verify(chipsim.identity_message("P0001", "cd" * 32), signature)


@pytest.mark.parametrize("serial", ["../etc/passwd", "", "a/b", "x" * 65, "P1\n"])
def test_a_serial_that_is_not_one_is_refused(tmp_path, serial):
    with pytest.raises(ValueError):
        chipsim.ChipStore(tmp_path).make(serial)


def test_an_unknown_chip_has_no_log_to_export(tmp_path):
    with pytest.raises(ValueError, match="no chip"):
        chipsim.ChipStore(tmp_path).export("P0404")


def test_training_twice_logs_one_intact_chain_per_chip(tmp_path):
    store = chipsim.ChipStore(tmp_path / "chips")
    serials = ["P0001", "P0002"]
    keys = {s: store.make(s) for s in serials}
    first = store.train(serials, tmp_path / "run-1", steps=6, seed=1, snapshot_rate=0.5)
    store.train(serials, tmp_path / "run-2", steps=6, seed=2, snapshot_rate=0.5)
    for serial in serials:
        lines = store.export(serial).splitlines()
        assert len(lines) >= 2
        assert verify_log(lines, keys[serial], serial=serial) == []
        assert [json.loads(line)["counter"] for line in lines] == list(range(len(lines)))
    claimed = chipsim.claims_body(first, ["P0001"], "run-1")["claims"]
    recorded = json.loads((first / "claims.json").read_text())
    assert {(c["serial"], c["counter"], c["step"]) for c in claimed} == {
        (c["serial"], c["counter"], c["step"]) for c in recorded["claims"] if c["serial"] == "P0001"
    }
    assert all(c["manifest"] == recorded["manifest"] and c["run"] == "run-1" for c in claimed)


def test_the_command_line_answers_and_exports(tmp_path, capsys):
    assert chipsim.main(["--dir", str(tmp_path), "make", "P0001"]) == 0
    public = json.loads(capsys.readouterr().out)["P0001"]
    assert chipsim.main(["--dir", str(tmp_path), "answer", "P0001", "00ff"]) == 0
    signature = base64.b64decode(capsys.readouterr().out.strip())
    VerifyKey(base64.b64decode(public)).verify(chipsim.identity_message("P0001", "00ff"), signature)
    assert chipsim.main(["--dir", str(tmp_path), "export", "P0404"]) == 2


def _times(store, serial):
    return [json.loads(line)["time"] for line in store.export(serial).splitlines()]


def test_a_chip_never_logs_a_time_in_the_future_nor_before_its_last_record(tmp_path):
    from datetime import UTC, datetime, timedelta

    store = chipsim.ChipStore(tmp_path / "chips")
    serials = ["P0001", "P0002"]
    for serial in serials:
        store.make(serial)
    store.train(serials, tmp_path / "run-1", steps=8, seed=1, snapshot_rate=0.8)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for serial in serials:
        times = _times(store, serial)
        assert times and max(times) <= now and times == sorted(times)
    first = {serial: len(_times(store, serial)) for serial in serials}
    store.train(serials, tmp_path / "run-2", steps=8, seed=2, snapshot_rate=0.8)  # at once, on the same chips
    ahead = (datetime.now(UTC) + timedelta(seconds=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for serial in serials:
        times = _times(store, serial)
        assert times == sorted(times) and all(t <= ahead for t in times[first[serial] :])


def test_the_clock_squeezes_a_run_after_a_recent_one_at_a_second_a_step_at_least(tmp_path):
    from datetime import datetime, timedelta

    store = chipsim.ChipStore(tmp_path)
    store.make("P0001")
    store.train(["P0001"], tmp_path / "run-1", steps=4, seed=1, snapshot_rate=5.0)
    last = datetime.fromisoformat(_times(store, "P0001")[-1].replace("Z", "+00:00"))
    start, seconds = store.clock(["P0001"], 10, now=last + timedelta(seconds=110))
    assert start == last and seconds == 10 and start + timedelta(seconds=10 * seconds) <= last + timedelta(seconds=110)
    assert store.clock(["P0001"], 10, now=last + timedelta(seconds=5)) == (last, 1.0)  # at least a second a step
    start, seconds = store.clock(["P0001"], 10, now=last + timedelta(days=1))
    assert seconds == 60 and start + timedelta(minutes=10) == last + timedelta(days=1)  # a fresh run just ended


def test_replay_claim_names_the_run_after_its_folder_and_refuses_a_chip_the_run_never_used(tmp_path, capsys):
    from replay.__main__ import main

    store = chipsim.ChipStore(tmp_path / "chips")
    store.make("P0001")
    run = store.train(["P0001"], tmp_path / "run-6", steps=6, seed=1, snapshot_rate=5.0)
    assert main(["claim", str(run)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["claims"] and {c["run"] for c in body["claims"]} == {"run-6"}
    assert all(set(c) == {"serial", "counter", "run", "step", "manifest", "location"} for c in body["claims"])
    assert main(["claim", str(run), "--serials", "P0404"]) == 2
    assert "no snapshot of P0404 in this run" in capsys.readouterr().err
    assert main(["claim", str(tmp_path)]) == 2
    assert "a transcript folder" in capsys.readouterr().err


def test_replay_record_on_registered_chips_logs_their_own_firmware(tmp_path, capsys):
    from replay.__main__ import main

    store = chipsim.ChipStore(tmp_path / "chips")
    key = store.make("P0001")
    out = tmp_path / "run-1"
    args = ["record", "--arch", "mlp", "--steps", "4", "--out", str(out), "--snapshot-rate", "5"]
    assert main([*args, "--chip-dir", str(tmp_path / "chips"), "--serials", "P0001"]) == 0
    assert "python -m replay claim" in capsys.readouterr().err
    assert verify_log(store.export("P0001").splitlines(), key, serial="P0001") == []
    assert json.loads((out / "chips.json").read_text()) == {"P0001": key}
    assert main([*args, "--chip-dir", str(tmp_path / "chips")]) == 2  # --serials goes with it
    assert main([*args[:-2], "--out", str(tmp_path / "sim"), "--chips", "1"]) == 0
    assert "in no registry" in capsys.readouterr().err


def _records(store, serial):
    return [json.loads(line) for line in store.export(serial).splitlines()]


def test_work_counters_never_go_backwards_across_runs_even_unlogged_work(tmp_path):
    """Issue #19: the firmware's work counters count every FLOP the chip executed since fabrication. A first run in
    which the chip logged nothing (its work after its last snapshot, likewise) stays in them: the chip's next run,
    simulated after a restart (a new store on the same folder), carries on from what the chip holds, not from its
    last logged record -- which would forget that work (counters going backwards, hidden work erased)."""
    chipsim.ChipStore(tmp_path / "chips").make("P0001")
    chipsim.ChipStore(tmp_path / "chips").train(["P0001"], tmp_path / "run-1", steps=6, seed=1, snapshot_rate=1e-9)
    # no random snapshot in six steps: only the run's closing one (Firmware.finish), at step 6
    (closing,) = _records(chipsim.ChipStore(tmp_path / "chips"), "P0001")
    per_step = closing["flops"] / 6  # one chip: the whole model's step
    held = json.loads((tmp_path / "chips" / "P0001.state").read_text())
    assert per_step > 0 and held["flops"] == closing["flops"]
    # work the chip did that its log does not show (e.g. a job of another tool): the state holds it
    unlogged = {"busy_ns": held["busy_ns"] + 60 * 10**9, "flops": held["flops"] + 3 * int(per_step)}
    (tmp_path / "chips" / "P0001.state").write_text(json.dumps(unlogged))
    store = chipsim.ChipStore(tmp_path / "chips")  # a restart
    run = store.train(["P0001"], tmp_path / "run-2", steps=6, seed=2, snapshot_rate=5.0)
    steps = {c["counter"]: c["step"] for c in json.loads((run / "claims.json").read_text())["claims"]}
    first = _records(store, "P0001")[1]
    assert first["flops"] == (6 + 3 + steps[1]) * per_step  # run 1's six steps and the unlogged work counted
    held = json.loads((tmp_path / "chips" / "P0001.state").read_text())
    last = _records(store, "P0001")[-1]
    assert held["flops"] == 15 * per_step >= last["flops"] and held["busy_ns"] >= last["busy_ns"]
    (tmp_path / "chips" / "P0001.state").write_text(json.dumps({"busy_ns": 0, "flops": 0}))  # an older state
    chip = chipsim.ChipStore(tmp_path / "chips").firmware_chip("P0001", 0)
    assert (chip.flops, chip.busy_ns) == (last["flops"], last["busy_ns"])  # never below the chip's last record
    assert chip.counter == last["counter"] + 1


def test_a_message_about_many_chips_names_a_few_and_counts_the_rest(tmp_path, capsys):
    """A probe's `record --chips 4096` wrote every simulated serial into one 40 KB line of stderr."""
    from replay.__main__ import main
    from replay.prover import LISTED, listed

    assert listed(["A", "B"]) == "A, B"
    many = [f"S{i}" for i in range(4096)]
    assert listed(many) == ", ".join(many[:LISTED]) + f" and {4096 - LISTED:,} more"
    out = tmp_path / "sim"
    args = ["record", "--arch", "mlp", "--steps", "1", "--out", str(out), "--chips", "64", "--snapshot-rate", "0"]
    assert main(args) == 0
    said = capsys.readouterr().err
    assert f"and {64 - LISTED} more are simulated and in no registry" in said and len(said) < 1000
