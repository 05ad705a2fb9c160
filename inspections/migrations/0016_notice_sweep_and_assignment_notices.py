"""Notices: the tasks a draw assigns an inspection body are emailed through the same rows as alert notices (``draw``
and ``inspection_body`` set, no alert). Notices gain a ``sending`` state (a worker holds the notice until ``next_try_at``) and ``next_try_at`` (when
the next try is due), which the beat sweep ``inspections.tasks.resend_alert_notices`` reads to re-send notices whose
message was lost. Notices the broker refused before this (marked failed with no try spent) become due again."""

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone


def refused_ones_due_again(apps, schema_editor):
    AlertNotification = apps.get_model("inspections", "AlertNotification")
    AlertNotification.objects.filter(state="failed", attempts=0).update(state="retrying", next_try_at=timezone.now())


class Migration(migrations.Migration):
    dependencies = [
        ("inspections", "0015_identity_check_projection"),
        ("registry", "0004_d13_chip_serial_prefix"),
    ]

    operations = [
        migrations.AddField(
            model_name="alertnotification",
            name="draw",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notices",
                to="inspections.draw",
            ),
        ),
        migrations.AddField(
            model_name="alertnotification",
            name="inspection_body",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="registry.organisation",
            ),
        ),
        migrations.AlterField(
            model_name="alertnotification",
            name="alert",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="notifications",
                to="inspections.alert",
            ),
        ),
        migrations.AddField(
            model_name="alertnotification",
            name="next_try_at",
            field=models.DateTimeField(
                blank=True, help_text="when the next try is due (sending: when the worker's hold lapses)", null=True
            ),
        ),
        migrations.AlterField(
            model_name="alertnotification",
            name="state",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("sending", "Sending"),
                    ("retrying", "failed, retrying"),
                    ("sent", "Sent"),
                    ("failed", "failed, gave up"),
                ],
                default="queued",
                max_length=8,
            ),
        ),
        migrations.RunPython(refused_ones_due_again, migrations.RunPython.noop),
    ]
