from django.core.management.base import BaseCommand, CommandError

from inspections.demo_campaign import seed_inspections
from registry.demo_registry import DemoLogin, demo_password, seed_demo
from scenarios.demo_chain import seed_chain


class Command(BaseCommand):
    help = "Create the demo organisations, chips, users and a drawn inspection campaign (idempotent); print the logins."

    def add_arguments(self, parser):
        parser.add_argument("--password", help="password for every demo user (default: generated once, kept in var/)")
        parser.add_argument("--chips", type=int, default=5000, help="chips in the demo world (first run only)")
        parser.add_argument(
            "--no-chain", action="store_true", help="skip the honest and the cheating prover (they train small models)"
        )

    def handle(self, *args, **options):
        password, generated = demo_password(options["password"])
        try:
            logins = seed_demo(password, chips=options["chips"])
        except ValueError as error:
            raise CommandError(str(error)) from error
        seed_inspections()
        if not options["no_chain"]:
            logins += [DemoLogin(*login) for login in seed_chain(password)]
        self.stdout.write("Demo logins" + (" (password generated)" if generated else "") + f" — password: {password}")
        for login in logins:
            self.stdout.write(f"  {login.username:<12} {login.role:<40} API token {login.token}")
