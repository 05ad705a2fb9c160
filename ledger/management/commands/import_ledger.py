from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ledger import selectors
from ledger.backup import ImportRefused, import_ledger


class Command(BaseCommand):
    help = (
        "Load a file written by export_ledger into an empty (migrated) database; the ledger is verified before commit."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)

    def handle(self, *args, **options):
        try:
            header = import_ledger(options["file"])
        except (ImportRefused, OSError) as error:
            raise CommandError(f"nothing imported: {error}") from error
        self.stdout.write(f"imported {header['entries']} entries; root={selectors.root_at(header['entries']).hex()}")
