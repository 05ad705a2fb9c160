"""`manage.py plan_inspections`: how many chips to inspect to catch a run of H FLOPs (docs/draws.md, How many chips)."""

import argparse
import json
from fractions import Fraction

from django.core.management.base import BaseCommand, CommandError

from rules import sampling_plans

FLAGS = {
    "flops": "--flops",
    "chips": "--chips",
    "p": "--p",
    "snapshot_rate": "--snapshot-rate",
    "period_days": "--period-days",
    "run_days": "--run-days",
    "flops_per_chip_second": "--flops-per-chip-second",
}


def _number(text: str) -> Fraction:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}") from None


def _whole(text: str) -> int:
    value = _number(text)
    if value.denominator != 1:
        raise argparse.ArgumentTypeError(f"not a whole number of chips: {text!r}")
    return int(value)


class Command(BaseCommand):
    help = (
        "Plan randomized inspections that catch a training run of --flops FLOPs on a prover of --chips chips "
        "with probability --p (Shavit 2023 §3.2; --exact for sampling without replacement)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--flops", type=_number, required=True, help="the run's total FLOPs (H), e.g. 1e25")
        parser.add_argument("--chips", type=_whole, required=True, help="chips the prover holds (C)")
        parser.add_argument("--p", type=float, default=sampling_plans.DEFAULT_P, help="target detection probability")
        parser.add_argument(
            "--snapshot-rate",
            type=float,
            default=sampling_plans.DEFAULT_SNAPSHOT_RATE,
            help="snapshots per chip per day (f)",
        )
        parser.add_argument(
            "--period-days", type=float, default=sampling_plans.DEFAULT_PERIOD_DAYS, help="monitoring period (T_m)"
        )
        parser.add_argument(
            "--run-days", type=float, default=sampling_plans.DEFAULT_RUN_DAYS, help="the run's length (T)"
        )
        parser.add_argument(
            "--flops-per-chip-second",
            type=float,
            default=sampling_plans.DEFAULT_FLOPS_PER_CHIP_SECOND,
            help="one chip's sustained FLOP/s (a/86,400)",
        )
        parser.add_argument("--exact", action="store_true", help="sample without replacement (hypergeometric)")
        parser.add_argument("--json", action="store_true", help="print the plan as JSON")

    def handle(self, *args, **options):
        arguments = {name: options[name] for name in FLAGS}
        try:
            plan = sampling_plans.plan(**arguments, exact=options["exact"])
        except sampling_plans.PlanError as error:
            raise CommandError(f"{FLAGS.get(error.field, error.field)}: {error.message}") from error
        if options["json"]:
            self.stdout.write(json.dumps(plan.as_dict()))
        else:
            self.stdout.write(self._table(plan, arguments), ending="")

    @staticmethod
    def _table(plan: sampling_plans.Plan, arguments: dict) -> str:
        run = f"{float(arguments['flops']):.4g} FLOP over {arguments['run_days']:g} days"
        if plan.impossible:
            return (
                f"Impossible: a run of {run} needs {plan.chips_needed:,} chips but the prover holds {plan.chips:,}.\n"
            )
        model = "exact, without replacement" if plan.exact else "paper, with replacement"
        per_period = f"{plan.samples_per_period:,} every {arguments['period_days']:g} days"
        if plan.samples_per_period_unrounded is not None:
            per_period += f" (s = {plan.samples_per_period_unrounded:.6g})"
        rows = [
            ("model", model),
            ("run", run),
            ("chips needed", f"{plan.chips_needed:,}"),
            ("prover's chips", f"{plan.chips:,}"),
            ("catch per sample (q)", f"{plan.catch_probability:.6g}"),
            ("target p", f"{plan.target_probability:g}"),
            ("samples per period", per_period),
            ("samples per year", f"{plan.samples_per_year:,}"),
            ("detection probability", f"{plan.detection_probability:.6f}"),
        ]
        width = max(len(label) for label, _ in rows)
        return "".join(f"{label:<{width}}  {value}\n" for label, value in rows)
