"""Compliance reports (CSV and PDF) for a prover and a campaign, and ledger extracts with their proofs, checked
offline by the outside verifier (``python -m ledger.verify --extract``): a tampered extract is refused."""

import base64
import copy
import csv
import io
import json
import subprocess
import sys

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from inspections.demo_campaign import DEMO_CAMPAIGN
from inspections.models import Campaign
from inspections.services import campaigns
from ledger import services as ledger
from ledger.keys import verifier_key
from registry.models import Organisation
from tests.desk.pdf_text import pdf_text
from tlog.chain import LedgerFault
from tlog.extract import check_extract

pytestmark = pytest.mark.django_db


def _today() -> str:
    return timezone.localdate().isoformat()


def test_a_provers_compliance_report_as_csv_is_plain_text_and_named_for_it(regulator):
    owner = Organisation.objects.get(slug="owner-a")
    response = regulator.get(reverse("desk:organisation_report", args=["owner-a", "csv"]))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == f'attachment; filename="compliance-prover-owner-a-{_today()}.csv"'
    text = response.content.decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["report", f"Compliance report: {owner.legal_name}"]
    assert ["organisation", f"{owner.legal_name} (owner-a)"] in rows
    assert ["Campaigns targeting it"] in rows and any(row[:1] == [DEMO_CAMPAIGN] for row in rows)
    campaign_row = next(row for row in rows if row[:1] == [DEMO_CAMPAIGN])
    assert "chips each period" in campaign_row[3]  # the plan in words
    assert "<" not in text and "rule_flops" not in text and "samples_per_period" not in text


def test_a_campaigns_report_as_csv_lists_its_provers_draws_and_history(regulator):
    response = regulator.get(reverse("desk:campaign_report", args=[DEMO_CAMPAIGN, "csv"]))
    name = f"compliance-campaign-{DEMO_CAMPAIGN}-{_today()}.csv"
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert ["Provers"] in rows and ["Draws"] in rows and ["History on the ledger"] in rows
    assert any(row[:1] == ["owner-a"] for row in rows) and any(row[1:2] == ["campaign.created"] for row in rows)


def test_a_provers_compliance_report_as_pdf_names_the_prover(regulator):
    pytest.importorskip("fpdf", reason="fpdf2 is in requirements.txt: pip install -r requirements.txt")
    owner = Organisation.objects.get(slug="owner-a")
    response = regulator.get(reverse("desk:organisation_report", args=["owner-a", "pdf"]))
    body = response.content
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"] == f'attachment; filename="compliance-prover-owner-a-{_today()}.pdf"'
    assert body.startswith(b"%PDF-1.") and body.rstrip().endswith(b"%%EOF") and b"/Type /Page" in body
    text = pdf_text(body)
    assert f"Compliance report: {owner.legal_name}" in text and f"{owner.legal_name} (owner-a)" in text
    assert DEMO_CAMPAIGN in text and "Campaigns targeting it" in text


def test_a_campaign_report_as_pdf(regulator):
    pytest.importorskip("fpdf", reason="fpdf2 is in requirements.txt: pip install -r requirements.txt")
    body = regulator.get(reverse("desk:campaign_report", args=[DEMO_CAMPAIGN, "pdf"])).content
    assert body.startswith(b"%PDF-1.") and f"campaign {DEMO_CAMPAIGN}" in pdf_text(body)


def test_a_report_in_another_format_is_not_found_and_the_auditor_may_read_reports(regulator, auditor):
    assert regulator.get("/admin/desk/organisation/owner-a/report.xls").status_code == 404
    assert auditor.get(reverse("desk:campaign_report", args=[DEMO_CAMPAIGN, "csv"])).status_code == 200


# --- ledger extracts ------------------------------------------------------------------------------


def _extract(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
    return json.loads(response.content)


def test_an_organisations_extract_verifies_offline_and_a_tampered_one_is_refused(regulator, tmp_path):
    ledger.checkpoint_sign()
    response = regulator.get(reverse("desk:organisation_extract", args=["owner-a"]))
    name = f"ledger-extract-organisation-owner-a-{_today()}.json"
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'
    extract = json.loads(response.content)
    assert len(extract["entries"]) > 5 and extract["newer"] == 0
    report = check_extract(extract, verifier_key())
    assert report.entries == len(extract["entries"]) and report.subject == "organisation:owner-a"

    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(extract))
    tampered = copy.deepcopy(extract)
    leaf = json.loads(base64.b64decode(tampered["entries"][1]["leaf"]))
    leaf["actor"] = "someone-else"  # rewrite who did it: the proof no longer holds
    tampered["entries"][1]["leaf"] = base64.b64encode(json.dumps(leaf).encode()).decode()
    bad.write_text(json.dumps(tampered))
    command = [sys.executable, "-m", "ledger.verify", "--key", verifier_key(), "--extract"]
    ok = subprocess.run([*command, str(good)], capture_output=True, text=True, cwd=settings.BASE_DIR, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("OK extract organisation:owner-a entries="), ok.stderr
    refused = subprocess.run([*command, str(bad)], capture_output=True, text=True, cwd=settings.BASE_DIR, timeout=60)
    seq = tampered["entries"][1]["seq"]
    assert refused.returncode == 1 and f"FAIL seq={seq}: the leaf is not in the signed tree" in refused.stderr


@pytest.mark.parametrize(
    ("tamper", "says"),
    [
        (lambda e: e["entries"][0]["proof"].reverse(), "inclusion proof fails"),
        (lambda e: e["entries"].reverse(), "increasing seq order"),
        (lambda e: e.update(checkpoint=e["checkpoint"].replace("\n", "\n\n", 1)), "checkpoint"),
        (lambda e: e["entries"][0].update(seq=e["entries"][0]["seq"] + 1), "inclusion proof fails"),
        (lambda e: e.update(subject={"campaign": "another"}), "does not concern"),
        (lambda e: e.update(format="something-else"), "not a chipledger-extract/1 document"),
    ],
)
def test_a_campaigns_extract_refuses_every_tampering(regulator, tamper, says):
    ledger.checkpoint_sign()
    extract = _extract(regulator, reverse("desk:campaign_extract", args=[DEMO_CAMPAIGN]))
    kinds = {json.loads(base64.b64decode(e["leaf"]))["kind"] for e in extract["entries"]}
    assert {"campaign.created", "campaign.seed_committed", "campaign.drawn"} <= kinds
    assert check_extract(extract, verifier_key()).entries == len(extract["entries"])
    tamper(extract)
    with pytest.raises(LedgerFault, match=says):
        check_extract(extract, verifier_key())


def test_an_extract_under_another_key_is_refused(regulator):
    ledger.checkpoint_sign()
    extract = _extract(regulator, reverse("desk:campaign_extract", args=[DEMO_CAMPAIGN]))
    other = "localhost/chipledger+00000000+" + base64.b64encode(b"\x01" + b"\x02" * 32).decode()
    with pytest.raises(LedgerFault, match="not the pinned key"):
        check_extract(extract, other)


def test_entries_newer_than_the_checkpoint_are_counted_not_listed(regulator):
    ledger.checkpoint_sign()
    campaigns.campaign_seed_commit(Campaign.objects.get(slug=DEMO_CAMPAIGN), 99)  # after the checkpoint
    extract = _extract(regulator, reverse("desk:campaign_extract", args=[DEMO_CAMPAIGN]))
    assert extract["newer"] == 1 and check_extract(extract, verifier_key())
