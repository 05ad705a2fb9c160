"""The notice sweep: a notice whose message was lost is re-sent and delivered once; a worker that died holding one
loses it after its hold; the tries stay bounded; two workers with messages for one notice send it once (real
database, real local HTTP receiver)."""

import threading
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from inspections import tasks
from inspections.models import AlertNotification
from inspections.services import notifications
from tests.inspections.test_alert_notifications import high_alert, receiver  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def later(seconds: float = 0):
    return timezone.now() + timedelta(seconds=django_settings.ALERT_NOTIFY_SWEEP_GRACE + 1 + seconds)


def sweep(capture, when) -> tuple[dict, int]:
    with capture(execute=False) as sent:
        counts = notifications.notices_resend(when)
    return counts, len(sent)


def test_a_lost_message_is_resent_by_the_sweep_and_the_notice_delivered_once(
    receiver,  # noqa: F811
    high_alert,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")  # its message never ran
    assert sweep(django_capture_on_commit_callbacks, timezone.now()) == ({"resent": 0, "failed": 0}, 0)  # not late
    assert sweep(django_capture_on_commit_callbacks, later()) == ({"resent": 1, "failed": 0}, 1)
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True  # the original message, late: nothing
    assert len(receiver.received) == 1
    assert sweep(django_capture_on_commit_callbacks, later(3600)) == ({"resent": 0, "failed": 0}, 0)
    notice.refresh_from_db()
    assert (notice.state, notice.attempts) == ("sent", 1)


def test_a_worker_that_died_holding_a_notice_loses_it_after_its_hold(
    receiver,  # noqa: F811
    high_alert,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    assert notifications._take(notice.pk, timezone.now())  # a worker took it, then was killed
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is False  # held: a second message waits
    assert receiver.received == []
    assert sweep(django_capture_on_commit_callbacks, later())[0] == {"resent": 0, "failed": 0}  # the hold is on
    hold = notifications._hold().total_seconds()
    assert sweep(django_capture_on_commit_callbacks, later(hold))[0] == {"resent": 1, "failed": 0}
    AlertNotification.objects.filter(pk=notice.pk).update(next_try_at=timezone.now() - timedelta(seconds=1))
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True
    notice.refresh_from_db()
    assert (notice.state, notice.attempts, len(receiver.received)) == ("sent", 2, 1)


def test_the_sweep_gives_up_on_a_notice_out_of_tries(
    receiver,  # noqa: F811
    high_alert,  # noqa: F811
    settings,
    django_capture_on_commit_callbacks,
):
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    AlertNotification.objects.filter(pk=notice.pk).update(state="sending", attempts=settings.ALERT_NOTIFY_TRIES)
    counts, sent = sweep(django_capture_on_commit_callbacks, later(notifications._hold().total_seconds()))
    assert (counts, sent) == ({"resent": 0, "failed": 1}, 0)
    notice.refresh_from_db()
    assert notice.state == "failed" and "gave up after 3 tries" in notice.last_error
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is False and receiver.received == []


def test_a_notice_the_broker_refused_is_resent_by_the_sweep(
    receiver,  # noqa: F811
    high_alert,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    notifications.notice_unsent(notice.pk, ConnectionError("broker down"))
    notice.refresh_from_db()
    assert notice.state == "retrying" and notice.attempts == 0 and "broker down" in notice.last_error
    assert sweep(django_capture_on_commit_callbacks, later())[0] == {"resent": 1, "failed": 0}
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True and len(receiver.received) == 1


def test_beat_runs_the_notice_sweep():
    schedule = {entry["task"] for entry in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert "inspections.tasks.resend_alert_notices" in schedule


@pytest.mark.django_db(transaction=True)
def test_two_workers_with_messages_for_one_notice_send_it_once(receiver, high_alert):  # noqa: F811
    """Worker A has taken the notice and is posting it (the receiver holds the request); worker B's message for
    the same notice (the sweep's re-send) arrives meanwhile: B sends nothing, and A's delivery stands."""
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    arrived, release = threading.Event(), threading.Event()
    receiver.hold = (arrived, release)
    outcome = {}

    def worker_a():
        try:
            outcome["a"] = notifications.notice_deliver(notice.pk).state
        finally:
            connection.close()

    thread = threading.Thread(target=worker_a)
    thread.start()
    try:
        assert arrived.wait(30), "worker A never posted"
        outcome["b"] = notifications.notice_deliver(notice.pk).state
    finally:
        release.set()
        thread.join(60)
    assert outcome == {"a": "sent", "b": "sending"}
    assert notifications.notice_deliver(notice.pk).state == "sent"
    notice.refresh_from_db()
    assert (notice.state, notice.attempts, len(receiver.received)) == ("sent", 1, 1)


@pytest.mark.django_db(transaction=True)
def test_of_two_workers_taking_one_notice_at_the_same_instant_exactly_one_gets_it(receiver, high_alert):  # noqa: F811
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    for _ in range(10):
        AlertNotification.objects.filter(pk=notice.pk).update(state="queued", attempts=0)
        meet, taken = threading.Barrier(2, timeout=30), []

        def take():
            try:
                meet.wait()
                taken.append(notifications._take(notice.pk, timezone.now()))
            finally:
                connection.close()

        threads = [threading.Thread(target=take) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(taken) == [False, True]
        assert AlertNotification.objects.get(pk=notice.pk).attempts == 1
