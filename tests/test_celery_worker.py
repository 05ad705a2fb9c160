"""A real Celery worker (a subprocess on the leg's broker: Redis or kombu's filesystem) signs checkpoints."""

import os
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from ledger.models import Checkpoint
from ledger.tasks import checkpoint_if_grown
from tests.factories import append_sample_entries
from tests.helpers import subprocess_database_url
from tlog import merkle


def _worker(queue: str) -> list[str]:
    """A real Celery worker's command line, on a queue of its own (the solo pool: one task at a time)."""
    return [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo", "-Q", queue]


@pytest.fixture
def worker_queue():
    """Start a worker on a queue of its own, so no other worker can take the test's task."""
    queue = f"test-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    command = [*_worker(queue), "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel=WARNING"]
    process = subprocess.Popen(command, env=env, cwd=settings.BASE_DIR)
    try:
        yield queue
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_worker_signs_a_checkpoint_when_the_log_grew(worker_queue):
    rows = append_sample_entries(1) + append_sample_entries(20)  # the first entry is signed for at once
    size = checkpoint_if_grown.apply_async(queue=worker_queue).get(timeout=60)
    assert size == 21
    checkpoint = Checkpoint.objects.get(size=21)
    assert bytes(checkpoint.root) == merkle.root_from_leaf_hashes([bytes(r.hash) for r in rows])
    # Nothing new: the next run signs nothing.
    assert checkpoint_if_grown.apply_async(queue=worker_queue).get(timeout=60) is None
    assert list(Checkpoint.objects.order_by("size").values_list("size", flat=True)) == [1, 21]


def test_beat_schedules_the_checkpoint_task():
    entry = settings.CELERY_BEAT_SCHEDULE["ledger-checkpoint"]
    assert entry["task"] == checkpoint_if_grown.name
    assert entry["schedule"].total_seconds() > 0


@pytest.mark.django_db(transaction=True)
def test_worker_runs_the_periodic_draw(worker_queue):
    from django.utils import timezone

    from inspections.models import Draw, InspectionTask
    from inspections.services import campaigns
    from inspections.tasks import draw_due_campaigns
    from tests.inspections.factories import H100, YEAR, make_provers

    make_provers()
    campaigns.campaign_create(
        slug="worker-draw", provers=["owner-a"], rule_flops=20 * H100 * YEAR, starts_on=timezone.now().date()
    )
    assert draw_due_campaigns.apply_async(queue=worker_queue).get(timeout=60) == ["worker-draw:0"]
    draw = Draw.objects.get(campaign__slug="worker-draw")
    assert InspectionTask.objects.filter(draw=draw).count() > 0


def _procfile_pool() -> list[str]:
    """The embedded deployment's pool options, as the Procfile starts its worker."""
    line = next(
        line for line in (settings.BASE_DIR / "Procfile").read_text().splitlines() if line.startswith("worker:")
    )
    return [word for word in line.split() if word.startswith(("--pool", "--concurrency"))]


@pytest.mark.django_db(transaction=True)
def test_the_procfile_worker_survives_kill_9_of_a_pool_child_and_records_heartbeats():
    """kill -9 of an (idle) pool child must not wedge the worker: with the Procfile's pool the next task runs."""
    import signal

    from desk.models import Heartbeat
    from tests.helpers import wait_for

    assert any(option in ("--pool=threads", "--pool=solo") for option in _procfile_pool())
    queue = f"test-{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", *_procfile_pool(), "-Q", queue]
    process = subprocess.Popen([*command, "--without-gossip", "--without-mingle", "--loglevel=WARNING"], env=env)
    try:
        append_sample_entries(3)
        assert checkpoint_if_grown.apply_async(queue=queue).get(timeout=60) in (None, 3)
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        for child in children:  # a prefork pool would have some; the Procfile's pool has none to lose
            os.kill(int(child), signal.SIGKILL)
        append_sample_entries(2)
        assert checkpoint_if_grown.apply_async(queue=queue).get(timeout=60) == 5
        wait_for(lambda: Heartbeat.objects.filter(task=checkpoint_if_grown.name).exists(), what="a heartbeat")
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize(
    "environment,named",
    [
        ({"REPLAY_DEVICE": "tpu"}, "device 'tpu': use cpu, cuda or auto"),
        ({"REPLAY_FLOP_BUDGET": "nan"}, "REPLAY_FLOP_BUDGET='nan' is not a positive"),
        ({"REPLAY_VERIFIER_THREADS": "0"}, "REPLAY_VERIFIER_THREADS=0 is not a positive number of threads"),
        # a copy cap of 0 had made every honest transcript "malformed", final, against its prover
        ({"REPLAY_FETCH_MAX_FILES": "0"}, "REPLAY_FETCH_MAX_FILES=0 is not a positive number"),
    ],
)
def test_a_worker_that_could_not_verify_on_this_host_stops_at_start_naming_why(environment, named):
    """Each claim such a worker took would only end as the verifier's error (retried, its retries spent)."""
    command = _worker(f"test-{uuid.uuid4().hex}")
    env = {**os.environ, "DATABASE_URL": subprocess_database_url(), **environment}
    done = subprocess.run(command, env=env, cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"chipledger worker: cannot verify claims on this host: {named}" in done.stderr


def test_the_start_check_passes_a_usable_setting_and_leaves_torch_out_of_a_default_worker(settings, monkeypatch):
    import torch

    from config.celery import replay_settings_usable

    monkeypatch.delenv("REPLAY_MEMORY_BUDGET_BYTES", raising=False)
    monkeypatch.setenv("REPLAY_FLOP_BUDGET", "1e12")
    settings.REPLAY_DEVICE = "auto"
    replay_settings_usable()  # no SystemExit
    assert not torch.cuda.is_initialized()  # no CUDA context in the worker's parent, were there a card
    settings.REPLAY_DEVICE = "cpu"
    monkeypatch.setenv("REPLAY_FLOP_BUDGET", "-1")
    with pytest.raises(SystemExit, match="REPLAY_FLOP_BUDGET='-1'"):
        replay_settings_usable()
    monkeypatch.delenv("REPLAY_FLOP_BUDGET")
    code = "import sys, config.celery as c, django; django.setup(); c.replay_settings_usable(); print('torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAY_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=settings.BASE_DIR, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
