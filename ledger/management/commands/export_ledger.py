from pathlib import Path

from django.core.management.base import BaseCommand

from ledger.backup import export_ledger


class Command(BaseCommand):
    help = "Write the ledger (exact leaves) and every table beside it to FILE (JSON Lines; gzip if FILE ends in .gz)."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)

    def handle(self, *args, **options):
        header = export_ledger(options["file"])
        self.stdout.write(f"exported {header['entries']} entries to {options['file']}")
