from django.core.management.base import BaseCommand

from ledger import keys, services


class Command(BaseCommand):
    help = "Create the signing key if needed; on an empty log, write the genesis entry and sign the first checkpoint."

    def handle(self, *args, **options):
        opened = services.ledger_open()
        self.stdout.write(f"{'opened' if opened else 'already open'}: {keys.verifier_key()}")
