"""pgcrypto on PostgreSQL: draws rank chips with its HMAC inside the database (a no-op on SQLite)."""
from django.contrib.postgres.operations import CryptoExtension
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("inspections", "0001_initial")]
    operations = [CryptoExtension()]
