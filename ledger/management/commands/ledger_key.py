from django.core.management.base import BaseCommand

from ledger import keys


class Command(BaseCommand):
    help = "Create the ledger's signing key if it does not exist yet, and print its verifier key."

    def handle(self, *args, **options):
        self.stdout.write(keys.verifier_key())
