"""kill -9 of the web process (gunicorn's worker and master) during a signed 10,000-chip fabrication.

The moment is deterministic. The test holds, in a connection of its own, either the ledger's write lock (the
request waits inside its transaction, before it writes the entry) or an uncommitted chip with the request's
last serial (the request has written the ledger entry, its tree nodes and the chips before it, and waits on
the unique index). It kills gunicorn, then lets go: PostgreSQL aborts the dead client's transaction, so none
of the chips exist and the ledger and its projections verify. A client that re-signs and resends gets all of
them.
"""

import base64
import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command

from ledger import selectors as ledger_selectors
from ledger.services import LEDGER_LOCK_ID
from registry import services, signing
from registry.models import Chip
from registry.services.tokens import api_token_issue
from rules.identifiers import MAX_CHIPS
from tests.helpers import requires_postgres, subprocess_database_url, wait_for
from tests.registry.factories import chip_model, chip_public_key, facility, new_serials, organisation

pytestmark = [pytest.mark.postgres, requires_postgres, pytest.mark.django_db(transaction=True)]
CHIPS = MAX_CHIPS  # the largest bulk request: one ledger entry
FABRICATE = "/api/registry/chips/events/fabricate"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@contextmanager
def gunicorn():
    """gunicorn on 127.0.0.1 and a free port, on the test database; yields (port, master process)."""
    port = free_port()
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "API_RATE_PER_ORGANISATION": "1000/min"}
    command = [sys.executable, "-m", "gunicorn", "config.wsgi", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", "1", "--timeout", "300"]
    master = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: listening(port) or master.poll() is not None, what="gunicorn to listen")
        assert master.poll() is None, "gunicorn did not start"
        yield port, master
    finally:
        if master.poll() is None:
            master.terminate()
        master.wait(timeout=30)


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def fab():
    org, key = organisation("fab-tw", ["fab"], "TW")
    facility(org, "fab-tw-1", kind="fab")
    model = chip_model(org)
    user = get_user_model().objects.create_user(username="fab-tw-writer")
    services.member_add(user, org)
    return {"org": org, "key": key, "model": model, "token": api_token_issue(user)[1]}


def signed_fabrication(fab, serials: list[str], idempotency_key: str) -> tuple[bytes, dict]:
    public_key = chip_public_key()  # one key for all: the body's size, not key generation, is the point
    chips = [
        {"serial": s, "model": fab["model"].slug, "public_key": public_key, "facility": "fab-tw-1"} for s in serials
    ]
    body = json.dumps({"timestamp": int(time.time()), "nonce": secrets.token_hex(12), "chips": chips}).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Token {fab['token']}",
        signing.HEADER: signing.sign(fab["key"], body),
        "Idempotency-Key": idempotency_key,
    }
    return body, headers


def post(port: int, body: bytes, headers: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("POST", FABRICATE, body, headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post_in_background(port: int, body: bytes, headers: dict) -> threading.Thread:
    def send():
        try:
            post(port, body, headers)
        except (OSError, http.client.HTTPException):
            pass  # the server dies under it

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def blocked_by(observer, holder) -> list[int]:
    """The backends waiting for a lock the holder's connection has (the request's, once it got there)."""
    query = "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
    return [pid for (pid,) in observer.execute(query, [holder.info.backend_pid])]


def gone(observer, pid: int) -> bool:
    return not observer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()


def hold_ledger_lock(conn, fab, serials):
    conn.execute("SELECT pg_advisory_xact_lock(%s)", [LEDGER_LOCK_ID])


def hold_last_serial(conn, fab, serials):
    """An uncommitted chip with the request's last serial: its insert waits on the unique index, mid-write."""
    org, model = fab["org"], fab["model"]
    conn.execute(
        "INSERT INTO registry_chip (serial, model_id, fab_id, public_key, owner_id, possessor_id, country, status,"
        " status_before_missing, packaged, fabricated_seq, updated_seq)"
        " VALUES (%s, %s, %s, %s, %s, %s, 'TW', 'fabricated', '', false, 0, 0)",
        [serials[-1], model.id, org.id, base64.b64decode(chip_public_key()), org.id, org.id],
    )


def ledger_and_projections_verify() -> None:
    out = StringIO()
    call_command("verify_ledger", stdout=out, stderr=out)
    call_command("rebuild_projections", "--check", stdout=out, stderr=out)  # exits non-zero on any difference


@pytest.mark.parametrize("hold", [hold_ledger_lock, hold_last_serial], ids=["at the ledger lock", "mid-insert"])
def test_a_killed_web_process_writes_all_or_none_of_a_bulk_fabrication(fab, hold):
    serials = new_serials(CHIPS, prefix="KILL")
    body, headers = signed_fabrication(fab, serials, "fabricate-10k")
    size = ledger_selectors.ledger_size()
    url = subprocess_database_url()
    with (
        gunicorn() as (port, master),
        psycopg.connect(url) as holder,
        psycopg.connect(url, autocommit=True) as observer,
    ):
        hold(holder, fab, serials)  # in the holder's open transaction
        request = post_in_background(port, body, headers)
        (backend,) = wait_for(lambda: blocked_by(observer, holder), what="the request to wait inside its transaction")
        for pid in [*children(master.pid), master.pid]:
            os.kill(pid, signal.SIGKILL)
        master.wait(timeout=30)
        request.join(timeout=30)
        holder.rollback()  # let go: the dead client's transaction can only abort
        wait_for(lambda: gone(observer, backend), what="the request's backend to end")

    assert Chip.objects.filter(serial__in=serials).count() == 0
    assert ledger_selectors.ledger_size() == size
    ledger_and_projections_verify()

    with gunicorn() as (port, _):
        status, answer = post(port, body, headers)  # the same request: its nonce was spent, it never answered
        assert status == 409 and "re-sign" in json.dumps(answer), answer
        status, answer = post(port, *signed_fabrication(fab, serials, "fabricate-10k-again"))
        assert status == 201, answer
    assert Chip.objects.filter(serial__in=serials).count() == CHIPS
    assert ledger_selectors.ledger_size() == size + 1
    ledger_and_projections_verify()
