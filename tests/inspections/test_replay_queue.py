"""Replay verification has a queue of its own (GPU workers take only it); a worker without -Q takes both."""

from __future__ import annotations

from django.conf import settings

from config.celery import app
from inspections import queue


def test_claim_verification_goes_to_the_replay_queue_and_the_rest_to_the_default():
    route = lambda name: app.amqp.router.route({}, name)["queue"].name
    assert route(queue.VERIFY_CLAIM) == settings.REPLAY_QUEUE
    assert route(queue.REVERIFY_COVERAGE_CLAIM) == settings.REPLAY_QUEUE  # a replay too: GPU workers take it
    assert route(queue.CHECK_SNAPSHOT_LOG) == settings.CELERY_TASK_DEFAULT_QUEUE
    if settings.CELERY_TASK_DEFAULT_QUEUE == "celery":
        assert settings.REPLAY_QUEUE == "replay"


def test_a_worker_started_without_queues_consumes_the_replay_queue_too():
    """The Procfile's worker (make run) names no -Q: it consumes every queue the app declares."""
    declared = set(app.amqp.queues)
    assert {settings.CELERY_TASK_DEFAULT_QUEUE, settings.REPLAY_QUEUE} <= declared
    assert "-Q" not in (settings.BASE_DIR / "Procfile").read_text()


def test_a_worker_started_without_queues_never_takes_the_large_queue(monkeypatch):
    """A retry only a worker with larger budgets can verify (CELERY_REPLAY_LARGE_QUEUE) waits for one started on
    that queue: the embedded CPU worker (no -Q) would only fail it again."""
    from django.conf import settings as live

    monkeypatch.setattr(live, "REPLAY_LARGE_QUEUE", "replay-large")
    assert "replay-large" not in set(app.amqp.queues)
    sent = []
    monkeypatch.setattr(queue.transaction, "on_commit", lambda send: send())
    monkeypatch.setattr(queue.current_app, "send_task", lambda name, args, **kw: sent.append((name, args, kw)))
    queue.enqueue_claim_verification(7, countdown=30, larger_worker=True)
    queue.enqueue_claim_verification(8, countdown=30)
    assert sent == [
        (queue.VERIFY_CLAIM, (7,), {"countdown": 30, "queue": "replay-large"}),
        (queue.VERIFY_CLAIM, (8,), {"countdown": 30}),
    ]
