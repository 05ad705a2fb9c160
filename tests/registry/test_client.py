"""registry.api_client against the real app over HTTP: the README's examples run."""

import base64
import json
import subprocess
import sys

import pytest
from django.conf import settings

from registry import services
from registry.api_client import ApiError, RegistryClient
from registry.models import Chip
from tests.registry.factories import SignedClient, chip_model, chip_public_key, facility, new_serials, organisation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fab(live_server):
    org, key = organisation("fab-tw", ["fab"], "TW")
    organisation("vendor-a", ["vendor"], "US")
    facility(org, "fab-1", kind="fab")
    chip_model(org, "h100-sxm")
    services.export_licence_grant(
        licence_id="EL-1",
        exporter="fab-tw",
        consignee="vendor-a",
        from_country="TW",
        to_country="US",
        quantity=100,
        expires_on="2099-12-31",
    )
    token = SignedClient(org, key).api._credentials["HTTP_AUTHORIZATION"].split()[1]
    return {"url": live_server.url, "token": token, "key": key}


def test_client_fabricates_ships_and_reads(fab):
    client = RegistryClient(fab["url"], fab["token"], fab["key"])
    serials = new_serials(3)
    answer = client.fabricate([{"serial": s, "model": "h100-sxm", "public_key": chip_public_key()} for s in serials])
    assert answer["count"] == 3
    client.event("export", serials, consignee="vendor-a", reference="PO-1", export_licence="EL-1")
    assert [e["kind"] for e in client.chip(serials[0])["history"]] == ["chip.fabricated", "chip.exported"]
    with pytest.raises(ApiError) as error:
        client.event("receive", serials, facility="fab-1")  # only the consignee may receive
    assert error.value.status == 400 and "chips[0]" in error.value.answer


def test_cli_runs_without_django(fab, tmp_path):
    key_file = tmp_path / "fab.key"
    key_file.write_text(base64.b64encode(bytes(fab["key"])).decode())
    chips = tmp_path / "chips.json"
    serial = new_serials(1)[0]
    chips.write_text(json.dumps([{"serial": serial, "model": "h100-sxm", "public_key": chip_public_key()}]))
    base = [
        sys.executable,
        "-m",
        "registry.api_client",
        "--url",
        fab["url"],
        "--token",
        fab["token"],
        "--key-file",
        str(key_file),
    ]
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*base, "fabricate", str(chips)], capture_output=True, text=True, cwd=settings.BASE_DIR, env=env
    )
    assert done.returncode == 0, done.stderr
    assert Chip.objects.filter(serial=serial).exists()
    refused = subprocess.run(
        [*base, "event", "install", "--chips", serial, "--field", "facility=nowhere"],
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
        env=env,
    )
    assert refused.returncode == 1 and "facility" in refused.stderr
    shown = subprocess.run([*base, "chip", serial], capture_output=True, text=True, cwd=settings.BASE_DIR, env=env)
    assert json.loads(shown.stdout)["status"] == "fabricated"
