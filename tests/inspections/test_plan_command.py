"""`manage.py plan_inspections`: the JSON contract, the table and argument errors."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from rules import sampling_plans


def run(*args) -> str:
    out = io.StringIO()
    call_command("plan_inspections", *args, stdout=out)
    return out.getvalue()


def run_json(*args) -> dict:
    return json.loads(run(*args, "--json"))


def test_json_plan_for_a_gpt4_class_run():
    # Worked by hand in test_sampling.test_gpt4_class_run_on_a_large_prover: N = 317.098 → 318 chips,
    # s = 62.7155 → 63 per period, ⌈763.04⌉ = 764 per year, achieved 0.9010392.
    output = run_json("--flops", "1e25", "--chips", "100000")
    assert list(output) == ["chips_needed", "samples_per_period", "samples_per_year", "detection_probability"]
    assert output == {
        "chips_needed": 318,
        "samples_per_period": 63,
        "samples_per_year": 764,
        "detection_probability": sampling_plans.plan(10**25, 100_000).detection_probability,
    }
    assert output["detection_probability"] == pytest.approx(0.9010392, abs=1e-7)


def test_json_plan_with_every_option():
    # The hand-worked half-fleet case: N = 50 of 100, f = 0.1, T_m = 10, T = 100, p = 0.99 → 2 and 45.
    output = run_json(
        "--flops",
        "4.32e23",
        "--chips",
        "100",
        "--p",
        "0.99",
        "--snapshot-rate",
        "0.1",
        "--period-days",
        "10",
        "--run-days",
        "100",
        "--flops-per-chip-second",
        "1e15",
    )
    assert (output["chips_needed"], output["samples_per_period"], output["samples_per_year"]) == (50, 2, 45)
    assert output["detection_probability"] >= 0.99


def test_json_exact_plan():
    output = run_json("--flops", "1e25", "--chips", "1e5", "--exact")
    expected = sampling_plans.plan(10**25, 100_000, exact=True)
    assert output == expected.as_dict()
    assert output["samples_per_period"] == 63 and output["detection_probability"] >= 0.9
    # a small prover: far fewer inspections without replacement than the paper's formula asks for
    exact = run_json("--flops", "5.184e21", "--chips", "4", "--p", "0.75", "--run-days", "30", "--exact")
    paper = run_json("--flops", "5.184e21", "--chips", "4", "--p", "0.75", "--run-days", "30")
    assert (exact["samples_per_period"], paper["samples_per_period"]) == (2, 3)


def test_json_impossible_run():
    assert run_json("--flops", "1e25", "--chips", "317") == {"impossible": True, "chips_needed": 318}
    assert run_json("--flops", "1e25", "--chips", "0", "--exact") == {"impossible": True, "chips_needed": 318}


def test_readable_table():
    text = run("--flops", "1e25", "--chips", "100000")
    assert "--" not in text and "{" not in text
    for expected in ("chips needed", "318", "100,000", "samples per period", "63 every 30 days", "764", "0.901039"):
        assert expected in text
    assert "exact, without replacement" in run("--flops", "1e25", "--chips", "100000", "--exact")
    impossible = run("--flops", "1e25", "--chips", "100")
    assert impossible.startswith("Impossible") and "318 chips" in impossible and "holds 100" in impossible


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--chips", "100000"], "--flops"),
        (["--flops", "1e25"], "--chips"),
        (["--flops", "lots", "--chips", "100000"], "--flops"),
        (["--flops", "0", "--chips", "100000"], "--flops"),
        (["--flops", "-1e25", "--chips", "100000"], "--flops"),
        (["--flops", "1e25", "--chips", "1.5"], "--chips"),
        (["--flops", "1e25", "--chips", "-3"], "--chips"),
        (["--flops", "1e25", "--chips", "many"], "--chips"),
        (["--flops", "1e25", "--chips", "100000", "--p", "0"], "--p"),
        (["--flops", "1e25", "--chips", "100000", "--p", "1.2"], "--p"),
        (["--flops", "1e25", "--chips", "100000", "--p", "nan"], "--p"),
        (["--flops", "1e25", "--chips", "100000", "--p", "1"], "--p"),
        (["--flops", "1e25", "--chips", "100000", "--p", "high"], "--p"),
        (["--flops", "1e25", "--chips", "100000", "--snapshot-rate", "0"], "--snapshot-rate"),
        (["--flops", "1e25", "--chips", "100000", "--snapshot-rate", "inf"], "--snapshot-rate"),
        (["--flops", "1e25", "--chips", "100000", "--period-days", "-30"], "--period-days"),
        (["--flops", "1e25", "--chips", "100000", "--period-days", "400"], "--period-days"),
        (["--flops", "1e25", "--chips", "100000", "--run-days", "0"], "--run-days"),
        (["--flops", "1e25", "--chips", "100000", "--flops-per-chip-second", "0"], "--flops-per-chip-second"),
        (["--flops", "3.1536e23", "--chips", "10", "--snapshot-rate", "1e-4", "--exact"], "--p"),
    ],
)
def test_bad_arguments_raise_command_errors_naming_the_flag(args, flag):
    with pytest.raises(CommandError, match=flag):
        run(*args, "--json")


def test_unattainable_exact_target_reports_the_best_possible():
    with pytest.raises(CommandError, match=r"--p: p=0.9 is unattainable .* all 10 chips"):
        run("--flops", "3.1536e23", "--chips", "10", "--snapshot-rate", "1e-4", "--exact")
