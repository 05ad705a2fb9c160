from django.core.management.base import BaseCommand

from ledger import selectors, services


class Command(BaseCommand):
    help = "Sign a checkpoint of the ledger now (if it grew) and print it with its cosignatures."

    def handle(self, *args, **options):
        checkpoint = services.checkpoint_sign()
        self.stdout.write(selectors.checkpoint_text(checkpoint), ending="")
