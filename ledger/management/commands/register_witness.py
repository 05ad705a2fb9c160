from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from ledger import services


class Command(BaseCommand):
    help = "Register (or --revoke) a witness verifier key; recorded on the ledger."

    def add_arguments(self, parser):
        parser.add_argument("verifier_key", help="the witness's vkey: <name>+<hex keyid>+<base64(0x04||pubkey)>")
        parser.add_argument("--actor", default="regulator", help="organisation slug recorded as the actor")
        parser.add_argument("--revoke", action="store_true")

    def handle(self, *args, **options):
        action = services.witness_revoke if options["revoke"] else services.witness_register
        try:
            witness = action(options["verifier_key"], options["actor"])
        except ValidationError as error:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())) from error
        verb = "revoked" if options["revoke"] else "registered"
        self.stdout.write(f"{verb} witness {witness.name}")
