from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ledger import selectors
from ledger.backup import GUARDED, ImportRefused, import_ledger


class Command(BaseCommand):
    help = (
        "Load a file written by export_ledger into an empty (migrated) database. The trailer's signature and "
        "SHA-256 are checked before anything is written; the entries must end at a checkpoint signed by this "
        "log's key (and cosigned by its active witnesses); everything is verified before commit."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--include",
            default="",
            help=f"comma-separated groups of guarded rows to import too: {', '.join(GUARDED)} "
            "(users brings their memberships; tokens needs users). Without it they are skipped.",
        )

    def handle(self, *args, **options):
        include = {name.strip() for name in options["include"].split(",") if name.strip()}
        try:
            result = import_ledger(options["file"], include=include)
        except (ImportRefused, OSError) as error:
            raise CommandError(f"nothing imported: {error}") from error
        size = result.header["entries"]
        self.stdout.write(f"imported {size} entries; root={selectors.root_at(size).hex()}")
        for label, count in sorted(result.skipped.items()):
            self.stdout.write(f"skipped {count} {label} rows (guarded: name them with --include)")
