from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from ledger.backup import ExportRefused, export_ledger


class Command(BaseCommand):
    help = (
        "Sign a checkpoint, then write the ledger up to it (exact leaves), every table beside it and a signed "
        "trailer to FILE (JSON Lines; gzip if FILE ends in .gz)."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument(
            "--witness-wait",
            type=float,
            default=60.0,
            help="seconds to wait for every active witness to cosign the new checkpoint (default 60)",
        )

        parser.add_argument(
            "--without-private",
            action="store_true",
            help="leave out the private case files (inspections.CaseText): for a reader of the public ledger only",
        )

    def handle(self, *args, **options):
        try:
            header = export_ledger(
                options["file"], witness_wait=options["witness_wait"], private=not options["without_private"]
            )
        except (ExportRefused, OSError) as error:
            raise CommandError(f"nothing exported: {error}") from error
        self.stdout.write(f"exported {header['entries']} entries (ending at a signed checkpoint) to {options['file']}")
