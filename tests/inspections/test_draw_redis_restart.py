"""Redis restarts while a worker is in the middle of a draw: the draw completes exactly once.

The worker (prefork, as in production) runs ``draw_due_campaigns`` on a broker of its own: a redis-server this
test starts on a free port, so restarting it cannot break the shared Redis that other suites and ``make run``
use. The moment is deterministic: the test holds the ledger's advisory lock, so the draw waits inside its
transaction; Redis is shut down (``nosave``: the in-flight message and the unacked index are gone) and started
again, then the lock is released. Whether kombu restores the message on reconnection or not, the period has one
``campaign.drawn`` entry and one Draw, and beat's next run changes nothing.
"""

import os
import shutil
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager

import psycopg
import pytest
from celery import Celery
from django.conf import settings
from django.utils import timezone

from inspections.models import Draw
from inspections.services import campaigns
from ledger import selectors as ledger_selectors
from ledger.services import LEDGER_LOCK_ID
from tests.helpers import requires_postgres, subprocess_database_url, wait_for
from tests.inspections.factories import H100, YEAR, make_provers

pytestmark = [
    pytest.mark.postgres,
    requires_postgres,
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (set REDIS_URL)"),
    pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server"),
    pytest.mark.django_db(transaction=True),
]
DRAW_TASK = "inspections.tasks.draw_due_campaigns"


class RedisServer:
    """A throwaway redis-server on 127.0.0.1, without persistence (like CI's): a restart loses every message."""

    def __init__(self, folder):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def cli(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10)

    def answers(self) -> bool:
        return self.cli("ping").stdout.strip() == "PONG"

    def start(self) -> None:
        command = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "--port", str(self.port)]
        command += ["--save", "", "--appendonly", "no", "--dir", str(self.folder)]
        command += ["--logfile", str(self.folder / "redis.log"), "--pidfile", str(self.folder / "redis.pid")]
        subprocess.run(command, check=True, timeout=10)
        wait_for(self.answers, timeout=30, what="redis-server to answer")

    def stop(self) -> None:
        self.cli("shutdown", "nosave")
        wait_for(lambda: not self.answers(), timeout=30, what="redis-server to stop")


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()  # whatever happened, nothing of ours is left listening


@pytest.fixture
def worker(redis_server, tmp_path):
    queue = f"redis-restart-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "REDIS_URL": redis_server.url}
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=prefork", "--concurrency=1"]
    command += ["-Q", queue, "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel=WARNING"]
    process = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    try:
        yield queue
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def app(redis_server):
    """A client of the test's broker. Not the current app: later tests' tasks must keep to the leg's Redis."""
    client = Celery("redis-restart-test", broker=redis_server.url, backend=redis_server.url, set_as_current=False)
    try:
        yield client
    finally:
        client.close()


@contextmanager
def ledger_lock():
    """The ledger's write lock, held by the test in a connection of its own; yields (connection, release).

    Taken after the test's own setup, which appends to the ledger (and would wait for itself).
    """
    with psycopg.connect(subprocess_database_url(), autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", [LEDGER_LOCK_ID])
        held = [True]

        def release():
            if held[0]:
                conn.execute("SELECT pg_advisory_unlock(%s)", [LEDGER_LOCK_ID])
                held[0] = False

        try:
            yield conn, release
        finally:
            release()


def someone_waits_for_the_lock(conn) -> bool:
    waiting = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()[0]
    return waiting > 0


def drawn_entries(slug: str) -> int:
    entries = ledger_selectors.entries_at(range(ledger_selectors.ledger_size()))
    return sum(1 for e in entries if e["kind"] == "campaign.drawn" and e["payload"]["campaign"] == slug)


def test_a_redis_restart_during_a_draw_leaves_exactly_one_draw(redis_server, worker, app):
    make_provers()
    campaigns.campaign_create(
        slug="restart", provers=["owner-a"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    with ledger_lock() as (conn, release):
        app.send_task(DRAW_TASK, queue=worker)
        wait_for(lambda: someone_waits_for_the_lock(conn), what="the draw to wait inside its transaction")
        redis_server.stop()  # the worker loses its broker with the task in flight
        redis_server.start()
        release()
    wait_for(lambda: Draw.objects.filter(campaign__slug="restart").exists(), what="the draw")

    # The worker is back on the broker; beat's next run draws nothing (it waits for a kombu restore, if any).
    assert app.send_task(DRAW_TASK, queue=worker).get(timeout=60) == []
    wait_for(lambda: redis_server.cli("llen", worker).stdout.strip() == "0", what="the queue to drain")
    wait_for(lambda: redis_server.cli("hlen", "unacked").stdout.strip() == "0", what="no unacked message")
    size = ledger_selectors.ledger_size()
    assert app.send_task(DRAW_TASK, queue=worker).get(timeout=60) == []
    assert ledger_selectors.ledger_size() == size

    assert Draw.objects.filter(campaign__slug="restart").count() == 1
    assert drawn_entries("restart") == 1
    draw = Draw.objects.get(campaign__slug="restart")
    assert ledger_selectors.first_entry("campaign.drawn", campaign="restart")["seq"] == draw.drawn_seq
