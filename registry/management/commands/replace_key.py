import base64
import binascii

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from registry import services
from registry.models import Organisation


class Command(BaseCommand):
    help = "Regulator: register a replacement key for an organisation that lost its key (revokes its keys; on the ledger with the reason)."

    def add_arguments(self, parser):
        parser.add_argument("organisation", help="the organisation's slug")
        parser.add_argument("public_key", help="base64 of the new Ed25519 public key (32 bytes)")
        parser.add_argument("--reason", required=True, help="why, e.g. 'key file lost with laptop, ticket 4411'")

    def handle(self, *args, **options):
        organisation = Organisation.objects.filter(slug=options["organisation"]).first()
        if organisation is None:
            raise CommandError(f"no organisation {options['organisation']!r}")
        try:
            public_key = base64.b64decode(options["public_key"], validate=True)
            key = services.organisation_key_replace(
                organisation=organisation, public_key=public_key, reason=options["reason"]
            )
        except (binascii.Error, ValueError) as error:  # ValueError: non-ASCII text is no base64 either
            raise CommandError(f"public_key: not base64 ({error})") from error
        except ValidationError as error:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())) from error
        self.stdout.write(f"registered key {key.key_id} for {organisation.slug} at seq {key.registered_seq}")
