"""Identity checks get a projection (``IdentityCheck``), so the inspector's portal reads a task's checks by task
instead of scanning the ledger for ``inspection.identity_checked``. The checks already on the ledger are projected
here, once (idempotent: a seq already projected is skipped), so an upgraded deployment needs no manual step."""

import django.db.models.deletion
from django.db import migrations, models

BATCH = 5000


def project_existing(apps, schema_editor):
    Entry = apps.get_model("ledger", "Entry")
    InspectionTask = apps.get_model("inspections", "InspectionTask")
    IdentityCheck = apps.get_model("inspections", "IdentityCheck")
    done = set(IdentityCheck.objects.values_list("seq", flat=True))
    checks = Entry.objects.filter(kind="inspection.identity_checked").order_by("seq")
    rows = []
    for seq, time, payload in checks.values_list("seq", "time", "payload").iterator(chunk_size=BATCH):
        task = _task(InspectionTask, payload.get("task"), payload.get("chip"))
        if seq in done or task is None:
            continue
        passed = payload.get("passed") is True
        rows.append(IdentityCheck(task=task, seq=seq, checked_at=time, passed=passed, reason=payload.get("reason")))
        if len(rows) >= BATCH:
            IdentityCheck.objects.bulk_create(rows)
            rows = []
    IdentityCheck.objects.bulk_create(rows)


def _task(InspectionTask, task_id, serial):
    """The task the entry names by id and chip (as rebuild_inspections reads it: else the chip's latest task)."""
    task = InspectionTask.objects.filter(pk=task_id, chip__serial=serial).first() if isinstance(task_id, int) else None
    return task or InspectionTask.objects.filter(chip__serial=serial).order_by("-pk").first()


class Migration(migrations.Migration):
    dependencies = [
        ("inspections", "0014_campaign_lifecycle"),
        ("ledger", "0003_no_truncate"),
    ]

    operations = [
        migrations.CreateModel(
            name="IdentityCheck",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.BigIntegerField(unique=True)),
                ("checked_at", models.DateTimeField()),
                ("passed", models.BooleanField()),
                ("reason", models.TextField(blank=True, null=True)),
                (
                    "task",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="identity_checks",
                        to="inspections.inspectiontask",
                    ),
                ),
            ],
        ),
        migrations.RunPython(project_existing, migrations.RunPython.noop),
    ]
