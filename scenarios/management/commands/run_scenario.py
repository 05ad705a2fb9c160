import sys

from django.core.management.base import BaseCommand

from scenarios.cases import SCENARIOS
from scenarios.runner import run_fresh, run_here


class Command(BaseCommand):
    help = (
        "Run a scenario (honest prover, or a cheater) from an empty throwaway database with its own Celery worker; "
        "exit 0 when the system reached the expected verdict, 1 otherwise. --list names them."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", choices=sorted(SCENARIOS))
        parser.add_argument("--list", action="store_true", help="list the scenarios")
        parser.add_argument("--keep", action="store_true", help="keep the throwaway database and folder")
        parser.add_argument("--here", action="store_true", help="run on the configured (empty) database itself")

    def handle(self, *args, **options):
        if options["list"] or not options["name"]:
            for scenario in SCENARIOS.values():
                self.stdout.write(f"{scenario.name:<20} {scenario.summary}")
            return
        run = run_here if options["here"] else run_fresh
        kwargs = {} if options["here"] else {"keep": options["keep"]}
        sys.exit(run(options["name"], stdout=self.stdout, **kwargs))
