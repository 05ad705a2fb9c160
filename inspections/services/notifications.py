"""Notices of high-severity alerts: an email through Django's mail backend and a signed webhook, each delivered by
the worker after the alert's transaction commits, retried with backoff, and kept as an ``AlertNotification`` row
whose state and last error the desk shows (a failing receiver is seen, not lost in a log). The email listing the
inspections a draw assigned a body goes out through the same rows (``assignment_notices_queue``).

A worker takes a notice before sending it, by one atomic ``UPDATE ... WHERE`` (queued or retrying, or sending with
a lapsed hold -> sending, held for ``_hold()``): of two workers holding messages for the same notice, the database
lets exactly one take it, so a notice is never sent twice at once and never again once sent. Tries are counted on
the row, so the bound (``ALERT_NOTIFY_TRIES``) holds however many messages were sent for it. A beat sweep
(``notices_resend``) re-sends each notice whose try is overdue (its message lost: a broker restart, a killed
worker, a refused send) and gives up on one out of tries.
"""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from registry.models import Organisation

from ..models import Alert, AlertNotification, Draw
from ..queue import DELIVER_ALERT_NOTICE, enqueue_after_commit
from ..severity import severity_of
from ..webhooks import SIGNATURE_HEADER, webhook_signature

BACKOFF_CAP = 3600.0
ERROR_CHARS = 2000
SWEEP_BATCH = 500
UNSENT = (AlertNotification.State.QUEUED, AlertNotification.State.RETRYING, AlertNotification.State.SENDING)


def alert_notices_queue(alert: Alert) -> list[AlertNotification]:
    """For a high-severity alert, one notice per configured channel, sent by the worker once the alert commits."""
    if severity_of(alert.kind) != "high":
        return []
    targets = []
    if settings.ALERT_EMAILS:
        targets.append((AlertNotification.Channel.EMAIL, ", ".join(settings.ALERT_EMAILS)))
    if settings.ALERT_WEBHOOK_URL:
        targets.append((AlertNotification.Channel.WEBHOOK, _shown_url(settings.ALERT_WEBHOOK_URL)))
    now = timezone.now()
    notices = [AlertNotification.objects.create(alert=alert, channel=c, target=t, next_try_at=now) for c, t in targets]
    for notice in notices:
        _enqueue(notice.pk)
    return notices


def assignment_notices_queue(draw: Draw) -> list[AlertNotification]:
    """One email notice per inspection body with members who have an email, listing the tasks the draw assigned it;
    written in the draw's transaction (so a crash after the commit loses none) and sent by the worker after it."""
    bodies = draw.tasks.exclude(inspection_body=None).values_list("inspection_body", flat=True).distinct()
    now, notices = timezone.now(), []
    for body in Organisation.objects.filter(pk__in=bodies).order_by("slug"):
        recipients = _members_emails(body)
        if recipients:
            notices.append(
                AlertNotification.objects.create(
                    draw=draw,
                    inspection_body=body,
                    channel=AlertNotification.Channel.EMAIL,
                    target=", ".join(recipients)[:500],
                    next_try_at=now,
                )
            )
    for notice in notices:
        _enqueue(notice.pk)
    return notices


def notice_unsent(notice_id: int, error: Exception) -> None:
    """The broker refused the notice's message: the row says so, and the sweep re-sends it (no try was spent)."""
    AlertNotification.objects.filter(
        pk=notice_id, state__in=(AlertNotification.State.QUEUED, AlertNotification.State.RETRYING)
    ).update(
        state=AlertNotification.State.RETRYING,
        next_try_at=timezone.now(),
        last_error=f"not queued, the broker refused it (the sweep re-sends it): {error}"[:ERROR_CHARS],
    )


def notice_deliver(notice_id: int) -> AlertNotification:
    """Take the notice and try to deliver it; the row after the try. ``sent``: delivered (now or before);
    ``retrying``: this try failed, the next is due at ``next_try_at``; ``failed``: out of tries; ``sending``: another
    worker holds it (this one sends nothing)."""
    taken = _take(notice_id, timezone.now())
    notice = AlertNotification.objects.select_related(
        "alert__prover", "alert__chip", "draw__campaign", "inspection_body"
    ).get(pk=notice_id)
    if not taken:
        return notice  # sent, given up, or held by another worker: a duplicate message does nothing
    try:
        if notice.draw_id:
            _send_assignment(notice)
        else:
            (_send_email if notice.channel == AlertNotification.Channel.EMAIL else _send_webhook)(notice)
    except Exception as error:
        final = notice.attempts >= settings.ALERT_NOTIFY_TRIES
        notice.state = AlertNotification.State.FAILED if final else AlertNotification.State.RETRYING
        notice.next_try_at = None if final else timezone.now() + timedelta(seconds=notice_backoff(notice.attempts))
        notice.last_error = f"try {notice.attempts}: {type(error).__name__}: {error}"[:ERROR_CHARS]
        notice.save(update_fields=["state", "next_try_at", "last_error"])
        return notice
    notice.state, notice.sent_at, notice.next_try_at = AlertNotification.State.SENT, timezone.now(), None
    notice.save(update_fields=["state", "sent_at", "next_try_at"])
    return notice


def _take(notice_id: int, now: datetime) -> bool:
    """Hold the notice for this worker and count the try, in one statement the database applies to one worker only
    (PostgreSQL re-checks the WHERE after a concurrent update; SQLite serialises writers)."""
    takeable = Q(state__in=(AlertNotification.State.QUEUED, AlertNotification.State.RETRYING)) | Q(
        state=AlertNotification.State.SENDING, next_try_at__lt=now
    )
    held = AlertNotification.objects.filter(takeable, pk=notice_id, attempts__lt=settings.ALERT_NOTIFY_TRIES)
    return (
        held.update(state=AlertNotification.State.SENDING, attempts=F("attempts") + 1, next_try_at=now + _hold()) == 1
    )


def _hold() -> timedelta:
    """How long a worker holds a notice it took: a send is bounded by the webhook's timeout (mail by the backend's);
    past this the worker is presumed dead and the sweep re-sends the notice."""
    return timedelta(seconds=2 * settings.ALERT_WEBHOOK_TIMEOUT + 60)


def notices_resend(now: datetime) -> dict:
    """Beat: re-send every undelivered notice whose try is overdue by ``ALERT_NOTIFY_SWEEP_GRACE`` (its message was
    lost), and give up on one out of tries; returns the counts. Rows another sweep is at are skipped (skip_locked),
    and a re-sent message takes the notice like any other, so a delivered notice is never sent again."""
    cutoff = now - timedelta(seconds=settings.ALERT_NOTIFY_SWEEP_GRACE)
    overdue = AlertNotification.objects.filter(state__in=UNSENT).filter(
        Q(next_try_at__lt=cutoff) | Q(next_try_at=None, created_at__lt=cutoff)
    )
    counts = {"resent": 0, "failed": 0}
    with transaction.atomic():
        for notice in overdue.select_for_update(skip_locked=True, no_key=True).order_by("pk")[:SWEEP_BATCH]:
            if notice.attempts >= settings.ALERT_NOTIFY_TRIES:
                notice.state, notice.next_try_at = AlertNotification.State.FAILED, None
                notice.last_error = f"gave up after {notice.attempts} tries (the last never reported back)"
                notice.save(update_fields=["state", "next_try_at", "last_error"])
                counts["failed"] += 1
                continue
            AlertNotification.objects.filter(pk=notice.pk).update(next_try_at=now)  # next sweep: one grace later
            _enqueue(notice.pk)
            counts["resent"] += 1
    return counts


def _enqueue(notice_id: int) -> None:
    enqueue_after_commit(DELIVER_ALERT_NOTICE, notice_id, on_failure=lambda error: notice_unsent(notice_id, error))


def notice_backoff(tries: int) -> float:
    """Seconds to wait after the ``tries``-th failed try: the base, doubled each time, at most an hour."""
    return min(settings.ALERT_NOTIFY_BACKOFF * 2 ** (tries - 1), BACKOFF_CAP)


def notice_body(notice: AlertNotification) -> dict:
    """What a notice says: only what the public ledger already shows about the alert (never case text)."""
    alert = notice.alert
    return {
        "type": "alert.raised",
        "delivery": notice.pk,
        "alert": {
            "id": alert.pk,
            "seq": alert.raised_seq,
            "kind": alert.kind,
            "severity": severity_of(alert.kind),
            "prover": alert.prover.slug,
            "chip": alert.chip.serial if alert.chip else None,
            "task": alert.task_id,
            "detail": alert.detail,
            "raised_at": alert.raised_at.isoformat(),
            "url": settings.DESK_BASE_URL.rstrip("/") + reverse("desk:alert", args=[alert.pk]),
        },
    }


def _send_email(notice: AlertNotification) -> None:
    alert = notice_body(notice)["alert"]
    subject = f"[chipledger] high alert: {notice.alert.get_kind_display()} ({alert['prover']})"
    lines = [f"{key}: {value}" for key, value in alert.items() if value is not None]
    send_mail(subject, "\n".join(lines), settings.DEFAULT_FROM_EMAIL, settings.ALERT_EMAILS, fail_silently=False)


def _send_assignment(notice: AlertNotification) -> None:
    """The tasks the draw assigned the body, to its members (as they are now: one who left gets nothing)."""
    draw, body = notice.draw, notice.inspection_body
    tasks = list(draw.tasks.filter(inspection_body=body).select_related("chip__facility").order_by("chip__serial"))
    lines = "\n".join(
        f"  {t.chip.serial} at {t.chip.facility.slug if t.chip.facility else 'no facility'}, due {t.due_on}"
        for t in tasks
    )
    send_mail(
        f"{len(tasks)} chip inspections assigned ({draw.campaign.slug}, period {draw.period})",
        f"Inspections assigned to {body.slug}:\n{lines}\n",
        None,
        _members_emails(body),
        fail_silently=False,
    )


def _members_emails(body: Organisation) -> list[str]:
    return [m.user.email for m in body.members.select_related("user").order_by("user__pk") if m.user.email]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx is a failure to deliver, not an invitation to post the alert elsewhere


def _send_webhook(notice: AlertNotification) -> None:
    if urlsplit(settings.ALERT_WEBHOOK_URL).scheme not in ("http", "https"):
        raise ValueError("ALERT_WEBHOOK_URL must be an http(s) URL")  # urllib would also read file:// and ftp://
    if not settings.ALERT_WEBHOOK_SECRET:
        raise ValueError("ALERT_WEBHOOK_SECRET is not set: an unsigned alert would be worthless to the receiver")
    body = json.dumps(notice_body(notice), sort_keys=True, separators=(",", ":")).encode()
    signature = webhook_signature(settings.ALERT_WEBHOOK_SECRET, int(time.time()), body)
    request = urllib.request.Request(
        settings.ALERT_WEBHOOK_URL,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            SIGNATURE_HEADER: signature,
            "Chipledger-Delivery": str(notice.pk),
            "User-Agent": "chipledger-alerts/1",
        },
    )
    opener = urllib.request.build_opener(_NoRedirects)
    with opener.open(request, timeout=settings.ALERT_WEBHOOK_TIMEOUT) as response:
        response.read(1024)  # any 2xx is delivered; urllib raises HTTPError for the rest


def _shown_url(url: str) -> str:
    """The URL as the desk shows it: without credentials or a query that may carry a token."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))[:500]
