"""Nothing stops quietly: stale periodic tasks make /healthz 503, desk jobs that no worker finishes are failed
with the reason, a broker that refuses a job fails it (no 500), and a cache or broker outage is a 503 with
Retry-After."""

import shutil
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from desk.models import Heartbeat, Job
from desk.services import heartbeats, jobs

pytestmark = pytest.mark.django_db
CHECKPOINT = "ledger.tasks.checkpoint_if_grown"


@pytest.fixture
def staff(client, world):
    client.force_login(world["users"].get(username="regulator-staff"))
    return client


def _beat_all(age: timedelta = timedelta(0)) -> None:
    for task in heartbeats.periodic_intervals():
        Heartbeat.objects.update_or_create(
            task=task, defaults={"last_run_at": timezone.now() - age, "last_state": "SUCCESS"}
        )


def test_healthz_is_503_naming_the_periodic_task_two_intervals_overdue(client):
    _beat_all()
    assert client.get("/healthz").status_code == 200
    interval = heartbeats.periodic_intervals()[CHECKPOINT]
    overdue = timezone.now() - timedelta(seconds=2 * interval + settings.HEALTH_HEARTBEAT_GRACE + 5)
    Heartbeat.objects.filter(task=CHECKPOINT).update(last_run_at=overdue)
    response = client.get("/healthz")
    body = response.json()["periodic"]
    assert response.status_code == 503 and body["ok"] is False
    assert [line.split(":")[0] for line in body["stale"]] == [CHECKPOINT]
    assert "beat or worker stopped" in body["error"]


def test_a_task_that_never_ran_is_stale_once_the_worker_showed_life_long_enough_ago(client):
    Heartbeat.objects.create(task=CHECKPOINT, last_run_at=timezone.now(), last_state="SUCCESS")
    assert client.get("/healthz").status_code == 200  # just started: nothing is two intervals late yet
    Heartbeat.objects.filter(task=CHECKPOINT).update(last_run_at=timezone.now() - timedelta(days=3))
    stale = client.get("/healthz").json()["periodic"]["stale"]
    assert any("never ran" in line for line in stale) and any(line.startswith(CHECKPOINT) for line in stale)


def test_the_worker_records_a_heartbeat_for_periodic_tasks_only():
    heartbeats.heartbeat_record(CHECKPOINT, "SUCCESS")
    heartbeats.heartbeat_record("desk.tasks.run_job", "SUCCESS")
    assert list(Heartbeat.objects.values_list("task", flat=True)) == [CHECKPOINT]


def test_every_periodic_task_has_a_beat_entry_and_the_job_sweep_is_scheduled():
    assert "desk.tasks.sweep_jobs" in heartbeats.periodic_intervals()


def test_jobs_no_worker_finished_by_the_deadline_are_failed_with_the_reason():
    old = timezone.now() - timedelta(seconds=settings.DESK_JOB_DEADLINE + 1)
    stuck_running = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, state=Job.State.RUNNING, started_by="x")
    stuck_queued = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, state=Job.State.QUEUED, started_by="x")
    fresh = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, state=Job.State.RUNNING, started_by="x")
    done = Job.objects.create(kind=Job.Kind.INTEGRITY_SWEEP, state=Job.State.DONE, started_by="x")
    Job.objects.filter(pk__in=[stuck_running.pk, stuck_queued.pk, done.pk]).update(created_at=old)
    assert sorted(jobs.jobs_sweep()) == sorted([stuck_running.pk, stuck_queued.pk])
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {stuck_running.pk: "failed", stuck_queued.pk: "failed", fresh.pk: "running", done.pk: "done"}
    assert "no worker finished it" in Job.objects.get(pk=stuck_running.pk).message
    assert jobs.job_run(stuck_running.pk) == "failed"  # a late redelivery does not revive it


def test_a_sweep_started_while_the_broker_is_down_fails_its_job_with_the_reason(
    staff, django_capture_on_commit_callbacks
):
    refused = OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    with (
        mock.patch("inspections.queue.current_app.send_task", side_effect=refused),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = staff.post(reverse("desk:sweep"))
    assert response.status_code == 302
    job = Job.objects.get()
    assert job.state == "failed" and "could not be queued" in job.message and "Connection refused" in job.message


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server")
def test_a_sweep_started_while_a_real_redis_is_down_fails_its_job(staff, tmp_path, django_capture_on_commit_callbacks):
    """No mock of the send: a Celery app on a redis-server of its own, which is shut down before the sweep."""
    from celery import Celery

    from tests.inspections.test_draw_redis_restart import RedisServer

    redis = RedisServer(tmp_path)
    redis.start()
    app = Celery("redis-down", broker=redis.url, set_as_current=False)  # later tests keep the real app
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2}
    redis.stop()
    with (
        mock.patch("inspections.queue.current_app", app),
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = staff.post(reverse("desk:sweep"))
    assert response.status_code == 302
    job = Job.objects.get()
    assert job.state == "failed" and "could not be queued" in job.message and "start it again" in job.message


@pytest.mark.parametrize("outage", [RedisConnectionError("Connection refused"), OperationalError("broker down")])
def test_a_cache_or_broker_outage_is_a_503_with_retry_after(client, world, outage):
    with mock.patch("registry.login_throttle.cache.get", side_effect=outage):
        response = client.post("/admin/login/", {"username": "regulator-staff", "password": "x"})
    assert response.status_code == 503 and response["Retry-After"] == "30"
    assert "retry later" in response.json()["detail"]


def test_api_reads_and_the_dashboard_are_503_while_the_cache_is_down(client, world):
    """DRF's throttle and the desk read the cache: Redis down is 'retry later', not a 500."""
    from rest_framework.throttling import SimpleRateThrottle

    client.force_login(world["users"].get(username="regulator"))
    with mock.patch.object(SimpleRateThrottle, "cache") as cache:
        cache.get.side_effect = RedisConnectionError("Connection refused")
        response = client.get("/api/registry/chips")
    assert response.status_code == 503 and response["Retry-After"] == "30"
    with mock.patch("django.core.cache.cache.get", side_effect=RedisConnectionError("Connection refused")):
        dashboard = client.get("/admin/")
    assert dashboard.status_code in (200, 503)  # 200 when the page reads no cache; never a 500
    if dashboard.status_code == 503:
        assert dashboard["Retry-After"] == "30"
