import sys

from django.core.management.base import BaseCommand

from registry.lifecycle import LifecycleError
from registry.rebuild import differences, rebuild


class Command(BaseCommand):
    help = "Rebuild every registry table from the ledger alone (in a scratch world) and report differences."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="exit 1 if the live tables differ from the rebuild")

    def handle(self, *args, **options):
        try:
            scratch = rebuild()
        except LifecycleError as error:
            self.stderr.write(f"FAIL {error}")
            sys.exit(1)
        found = differences(scratch)
        for line in found:
            self.stdout.write(line)
        chips = len(scratch.chips)
        if found:
            self.stderr.write(f"FAIL {len(found)}{'+' if len(found) >= 50 else ''} differences ({chips} chips rebuilt)")
            if options["check"]:
                sys.exit(1)
        else:
            self.stdout.write(f"OK projections match the ledger: {len(scratch.organisations)} organisations, {chips} chips")
