"""The entry index's rows added since desk 0004, for the entries already on the ledger: ``hash:<first 16 hex of the
leaf hash>`` (search by hash), ``ref:<reference>`` (order, invoice and licence references) and, for a
``campaign.amended`` entry, ``org:<slug>`` of each prover of the entry it supersedes (an amendment that drops a
prover is in that prover's history). One pass in seq order; rows already there are kept (idempotent), so an
upgraded deployment needs no ``rebuild_projections --reindex``. (The rules are copied here, not imported: a
migration must keep meaning what it meant when written.)"""

from django.db import migrations

BATCH = 5000
HASH_PREFIX_HEX = 16
MAX_SUBJECT = 80
REFERENCE_FIELDS = ("reference", "export_licence")
CAMPAIGN_KINDS = ("campaign.created", "campaign.amended")


def provers_of(kind: str, payload: dict) -> list:
    params = payload.get("params")
    provers = params.get("provers") if kind == "campaign.amended" and isinstance(params, dict) else None
    provers = payload.get("provers") if kind == "campaign.created" else provers
    return [p for p in provers if isinstance(p, str) and p] if isinstance(provers, list) else []


def subjects_of(seq, kind, payload, leaf_hash, campaign_provers: dict) -> set[str]:
    found = {"hash:" + bytes(leaf_hash).hex()[:HASH_PREFIX_HEX]}
    found |= {f"ref:{payload[n]}" for n in REFERENCE_FIELDS if isinstance(payload.get(n), str) and payload[n]}
    if kind in CAMPAIGN_KINDS:
        supersedes = payload.get("supersedes")
        if kind == "campaign.amended" and isinstance(supersedes, int) and not isinstance(supersedes, bool):
            found |= {f"org:{slug}" for slug in campaign_provers.get(supersedes, [])}
        campaign_provers[seq] = provers_of(kind, payload)
    return {subject for subject in found if len(subject) <= MAX_SUBJECT}


def add_rows(apps, schema_editor):
    Entry = apps.get_model("ledger", "Entry")
    EntrySubject = apps.get_model("desk", "EntrySubject")
    campaign_provers: dict[int, list] = {}  # seq of a campaign.created/amended entry -> the provers it names
    rows = []
    entries = Entry.objects.order_by("seq").values_list("seq", "kind", "payload", "hash")
    for seq, kind, payload, leaf_hash in entries.iterator(chunk_size=BATCH):
        found = subjects_of(seq, kind, payload if isinstance(payload, dict) else {}, leaf_hash, campaign_provers)
        rows += [EntrySubject(subject=s, seq=seq, kind=kind) for s in found]
        if len(rows) >= BATCH:
            EntrySubject.objects.bulk_create(rows, ignore_conflicts=True)
            rows = []
    EntrySubject.objects.bulk_create(rows, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("desk", "0004_entry_index_tasks_campaigns"),
        ("ledger", "0003_no_truncate"),
    ]

    operations = [migrations.RunPython(add_rows, migrations.RunPython.noop)]
