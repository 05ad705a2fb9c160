from django.core.management.base import BaseCommand

from registry.demo import demo_password, seed_demo


class Command(BaseCommand):
    help = "Create the demo organisations, chips and users (idempotent) and print the logins."

    def add_arguments(self, parser):
        parser.add_argument("--password", help="password for every demo user (default: generated once, kept in var/)")
        parser.add_argument("--chips", type=int, default=5000, help="chips in the demo world (first run only)")

    def handle(self, *args, **options):
        password, generated = demo_password(options["password"])
        logins = seed_demo(password, chips=options["chips"])
        self.stdout.write("Demo logins" + (" (password generated)" if generated else "") + f" — password: {password}")
        for login in logins:
            self.stdout.write(f"  {login.username:<12} {login.role:<40} API token {login.token}")
