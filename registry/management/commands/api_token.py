"""Issue or revoke an API token. A new token is printed once here and stored only as its hash."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from registry.models import ApiToken
from registry.services.tokens import api_token_issue, api_token_revoke


class Command(BaseCommand):
    help = "issue USERNAME [--label L] prints a new token once; revoke PREFIX revokes the token(s) starting so"

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["issue", "revoke"])
        parser.add_argument("name", help="username (issue) or the token's shown prefix (revoke)")
        parser.add_argument("--label", default="")

    def handle(self, *args, action, name, label, **options):
        if action == "issue":
            user = get_user_model().objects.filter(username=name).first()
            if user is None:
                raise CommandError(f"no user {name!r}")
            row, token = api_token_issue(user, label)
            self.stderr.write(f"token {row.prefix}… for {user.username}: shown once, store it now")
            self.stdout.write(token)
            return
        rows = list(ApiToken.objects.filter(prefix=name, revoked_at__isnull=True))
        if len(rows) != 1:
            raise CommandError(f"{len(rows)} active tokens have prefix {name!r}; expected exactly one")
        api_token_revoke(rows[0])
        self.stdout.write(f"revoked {rows[0]}")
