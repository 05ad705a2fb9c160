"""kill -9 during a snapshot-log check, on Redis: the task is redelivered and the log gets exactly one verdict.

Two faults: the pool child dies (the message is handed back at once: reject on worker lost), and the whole
worker dies (the message comes back after Redis's visibility timeout, shortened here, to a new worker).
"""

import os
import signal
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from inspections.models import SnapshotLog
from inspections.services import inspectors
from inspections.tasks import check_snapshot_log
from ledger.models import Entry
from tests.helpers import requires_postgres, subprocess_database_url, wait_for
from tests.inspections.factories import accepted
from tests.inspections.services.test_inspectors import a_task, firmware_log, with_chip_key

pytestmark = [
    pytest.mark.postgres,
    requires_postgres,
    pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (set REDIS_URL)"),
    pytest.mark.django_db(transaction=True),
]


def start_worker(queue: str, fault_dir, pool: str) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), "FAULT_DIR": str(fault_dir)}
    env["CELERY_VISIBILITY_TIMEOUT"] = "5"
    code = "import tests.inspections.fault_hooks; from celery.__main__ import main; main()"
    command = [sys.executable, "-c", code, "-A", "config", "worker", f"--pool={pool}", "--concurrency=1"]
    command += ["-Q", queue, "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel=WARNING"]
    return subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)


@pytest.fixture
def log(draw, django_capture_on_commit_callbacks):
    task = accepted(a_task("inspect-eu"))
    key = with_chip_key(task)
    with django_capture_on_commit_callbacks(execute=False):
        return inspectors.snapshot_log_upload(
            task, task.inspection_body, "\n".join(firmware_log(key, task.chip.serial, 3))
        )


@pytest.mark.parametrize("victim", ["pool child", "whole worker"])
def test_a_killed_check_is_redelivered_and_recorded_once(log, tmp_path, victim):
    queue = f"fault-{uuid.uuid4().hex[:12]}"
    worker = start_worker(queue, tmp_path, "prefork")
    others = []
    try:
        check_snapshot_log.apply_async(args=[log.pk], queue=queue)
        started = tmp_path / "started"
        wait_for(lambda: started.exists() and started.read_text())
        if victim == "pool child":
            os.kill(int(started.read_text()), signal.SIGKILL)  # the parent hands the message back
        else:
            worker.kill()  # SIGKILL: the main process and its child die holding the unacknowledged message
            os.kill(int(started.read_text()), signal.SIGKILL)
            worker.wait(timeout=30)
            others.append(start_worker(queue, tmp_path, "prefork"))  # a fresh worker finds it
        wait_for(lambda: SnapshotLog.objects.get(pk=log.pk).status != "pending")
    finally:
        for process in [worker, *others]:
            process.terminate()
            process.wait(timeout=30)
    log.refresh_from_db()
    assert log.status == "intact" and log.attempts == 2
    assert Entry.objects.filter(kind="inspection.snapshot_log", payload__task=log.task_id).count() == 1
