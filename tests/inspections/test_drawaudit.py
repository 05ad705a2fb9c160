"""``python -m inspections.drawaudit``: anyone recomputes a draw from the public API alone (no Django,
no database), and a period that is not drawn yet says so instead of "mismatch"."""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from inspections.services import campaigns
from ledger import keys
from ledger import selectors as ledger_selectors
from ledger import services as ledger_services
from rules import draw_ranking
from rules.draw_auditor import main
from tests.inspections.factories import H100, YEAR, make_provers

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def drawn():
    make_provers()
    campaign = campaigns.campaign_create(
        slug="frontier-2026",
        provers=["owner-a", "owner-b"],
        rule_flops=20 * H100 * YEAR,
        starts_on=timezone.now().date(),
    )
    campaigns.campaign_draw(campaign, 0)
    ledger_services.checkpoint_sign()  # the public checkpoint covers the draw
    return campaign


def test_a_draw_recomputed_from_the_public_api_matches(live_server, drawn, capsys):
    assert (
        main(["--url", live_server.url, "--campaign", "frontier-2026", "--period", "0", "--key", keys.verifier_key()])
        == 0
    )
    assert capsys.readouterr().out.startswith("MATCH campaign=frontier-2026 period=0 provers=2")


def test_runs_without_django_or_a_database(live_server, drawn):
    """As a third party runs it: a subprocess with no Django settings; it must not even import Django."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO") and k != "DATABASE_URL"}
    code = (
        "import sys, runpy; sys.argv = ['drawaudit', '--url', sys.argv[1], '--campaign', 'frontier-2026', "
        "'--period', '0', '--json']\n"
        "try:\n    runpy.run_module('inspections.drawaudit', run_name='__main__')\n"
        "except SystemExit as e:\n    assert 'django' not in sys.modules, 'imported django'\n    raise"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, live_server.url], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "match"


@pytest.mark.parametrize(
    ("campaign", "period", "said"), [("frontier-2026", 1, "NOT DRAWN YET"), ("nope", 0, "NO SUCH")]
)
def test_a_period_not_drawn_yet_is_not_a_mismatch(live_server, drawn, capsys, campaign, period, said):
    assert main(["--url", live_server.url, "--campaign", campaign, "--period", str(period)]) == 3
    assert capsys.readouterr().err.startswith(said)


def test_a_cherry_picked_draw_is_a_mismatch(live_server, drawn, capsys):
    """The old sample under a new seed (as tests/inspections/services/test_campaigns.py forges it)."""
    seed = draw_ranking.new_seed()
    ledger_services.append_entry(
        "campaign.seed_committed",
        {"campaign": drawn.slug, "period": 9, "commitment": draw_ranking.commitment(seed)},
        "regulator",
    )
    checkpoint = ledger_services.checkpoint_sign()
    payload = ledger_selectors.first_entry("campaign.drawn", campaign=drawn.slug, period=0)["payload"]
    forged = {
        **payload,
        "period": 9,
        "seed": seed.hex(),
        "checkpoint": {"size": checkpoint.size, "root": base64.b64encode(bytes(checkpoint.root)).decode()},
    }
    ledger_services.append_entry("campaign.drawn", forged, "regulator")
    ledger_services.checkpoint_sign()
    assert main(["--url", live_server.url, "--campaign", drawn.slug, "--period", "9"]) == 1
    assert "MISMATCH" in capsys.readouterr().err


def test_an_unreachable_log_is_exit_2(capsys):
    assert main(["--url", "http://127.0.0.1:9", "--campaign", "c", "--period", "0", "--timeout", "2"]) == 2
    assert capsys.readouterr().err.startswith("error:")
