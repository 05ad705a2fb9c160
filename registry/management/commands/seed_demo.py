from django.core.management.base import BaseCommand

from registry.demo import demo_password, seed_demo


class Command(BaseCommand):
    help = "Create the demo users and demo data (idempotent) and print the logins."

    def add_arguments(self, parser):
        parser.add_argument("--password", help="password for every demo user (default: generated once, kept in var/)")

    def handle(self, *args, **options):
        password, generated = demo_password(options["password"])
        logins = seed_demo(password)
        self.stdout.write("Demo logins" + (" (password generated)" if generated else "") + ":")
        for login in logins:
            self.stdout.write(f"  {login.username:<12} {login.role}")
        self.stdout.write(f"  password     {password}")
