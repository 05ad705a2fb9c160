import sys

from django.core.management.base import BaseCommand

from inspections.rebuild import differences, rebuild
from registry.lifecycle import LifecycleError

LIMIT = 50


class Command(BaseCommand):
    help = (
        "Rebuild every projection (the registry's and the inspections' tables) from the ledger alone, "
        "in a scratch world, and report differences."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="exit 1 if the live tables differ from the rebuild")

    def handle(self, *args, **options):
        try:
            world = rebuild()
        except LifecycleError as error:
            self.stderr.write(f"FAIL {error}")
            sys.exit(1)
        found = differences(world, LIMIT)
        for line in found:
            self.stdout.write(line)
        chips = len(world.registry.chips)
        if found:
            more = "+" if len(found) >= LIMIT else ""
            self.stderr.write(f"FAIL {len(found)}{more} differences ({chips} chips rebuilt)")
            if options["check"]:
                sys.exit(1)
        else:
            self.stdout.write(
                f"OK projections match the ledger: {len(world.registry.organisations)} organisations, {chips} chips, "
                f"{len(world.campaigns)} campaigns, {len(world.tasks)} inspection tasks, {len(world.claims)} claims"
            )
