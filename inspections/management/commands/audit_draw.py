import sys

from django.core.management.base import BaseCommand

from inspections.stored_draw_audit import audit_draw
from rules.draw_recompute import MATCH, MISMATCH


class Command(BaseCommand):
    help = (
        "Recompute a campaign's draw for one period from the ledger alone and say whether it matches "
        "(exit 0), differs (exit 1) or is not drawn yet (exit 3)."
    )

    def add_arguments(self, parser):
        parser.add_argument("campaign")
        parser.add_argument("period", type=int)

    def handle(self, *args, **options):
        audit = audit_draw(options["campaign"], options["period"])
        if audit.outcome != MATCH:
            word = "MISMATCH" if audit.outcome == MISMATCH else audit.outcome.upper()
            for problem in audit.problems:
                self.stderr.write(f"{word} {problem}")
            sys.exit(1 if audit.outcome == MISMATCH else 3)
        drawn = sum(len(p["drawn"]) for p in audit.provers.values())
        self.stdout.write(
            f"MATCH campaign={audit.campaign} period={audit.period} provers={len(audit.provers)} drawn={drawn}"
        )
