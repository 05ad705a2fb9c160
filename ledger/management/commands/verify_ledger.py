import sys

from django.core.management.base import BaseCommand

from ledger.integrity import verify_stored_ledger
from tlog.chain import LedgerFault


class Command(BaseCommand):
    help = "Recompute the chain, leaf hashes, tree root and checkpoint signatures; exit 1 naming the first bad seq."

    def handle(self, *args, **options):
        progress = None
        if options["verbosity"] > 1:
            progress = lambda n: self.stderr.write(f"  verified {n} entries")
        try:
            report = verify_stored_ledger(progress=progress)
        except LedgerFault as failure:
            self.stderr.write(f"FAIL {failure}")
            sys.exit(1)
        self.stdout.write(f"OK entries={report.entries} root={report.root.hex()}")
