"""`manage.py rebuild_projections`: every app's projection rebuilt from the ledger alone and compared.

It lives in the desk, the one app that may import every other: the inspections rebuild (one pass over
the ledger that also feeds the registry's) and the desk's own entry index.
"""

import sys

from django.core.management.base import BaseCommand

from desk import rebuild_index as desk_rebuild
from inspections.rebuild_inspections import differences, rebuild
from rules.chip_lifecycle import LifecycleError

LIMIT = 50


class Command(BaseCommand):
    help = (
        "Rebuild every projection (the registry's and the inspections' tables) from the ledger alone, "
        "in a scratch world, and report differences."
    )

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="exit 1 if the live tables differ from the rebuild")
        parser.add_argument(
            "--reindex", action="store_true", help="replace the desk's entry index (entries by organisation, counts)"
        )

    def handle(self, *args, **options):
        try:
            world = rebuild()
        except LifecycleError as error:
            self.stderr.write(f"FAIL {error}")
            sys.exit(1)
        if options["reindex"]:
            self.stdout.write(f"reindexed: {desk_rebuild.reindex()} entry index rows")
        found = differences(world, LIMIT)
        found += desk_rebuild.differences(LIMIT - len(found)) if len(found) < LIMIT else []
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
