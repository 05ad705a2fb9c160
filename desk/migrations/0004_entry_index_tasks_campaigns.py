"""The entry index gains ``task:<pk>`` and ``campaign:<slug>`` subjects (desk.services.index.subjects): the task
and draw pages read their entries through them instead of scanning the ledger for a kind. This adds the rows of
the entries already on the ledger (one pass over those whose payload names a task or a campaign)."""

from django.db import migrations
from django.db.models import Q

BATCH = 5000


def subjects_of(payload: dict) -> list[str]:
    task, campaign = payload.get("task"), payload.get("campaign")
    found = []
    if isinstance(task, int) and not isinstance(task, bool):
        found.append(f"task:{task}")
    if isinstance(campaign, str) and campaign:
        found.append(f"campaign:{campaign}"[:80])
    return found


def add_rows(apps, schema_editor):
    Entry = apps.get_model("ledger", "Entry")
    EntrySubject = apps.get_model("desk", "EntrySubject")
    about = Entry.objects.filter(Q(payload__has_key="task") | Q(payload__has_key="campaign")).order_by("seq")
    rows = []
    for seq, kind, payload in about.values_list("seq", "kind", "payload").iterator(chunk_size=BATCH):
        rows += [EntrySubject(subject=s, seq=seq, kind=kind) for s in subjects_of(payload)]
        if len(rows) >= BATCH:
            EntrySubject.objects.bulk_create(rows, ignore_conflicts=True)
            rows = []
    EntrySubject.objects.bulk_create(rows, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("desk", "0003_heartbeats"),
        ("ledger", "0003_no_truncate"),
    ]

    operations = [migrations.RunPython(add_rows, migrations.RunPython.noop)]
