"""Notices of high-severity alerts: an email through Django's mail backend and a signed webhook, each delivered by
the worker after the alert's transaction commits, retried with backoff, and kept as an ``AlertNotification`` row
whose state and last error the desk shows (a failing receiver is seen, not lost in a log)."""

from __future__ import annotations

import json
import time
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.mail import send_mail
from django.urls import reverse
from django.utils import timezone

from ..models import Alert, AlertNotification
from ..queue import DELIVER_ALERT_NOTICE, enqueue_after_commit
from ..severity import severity_of
from ..webhooks import SIGNATURE_HEADER, webhook_signature

BACKOFF_CAP = 3600.0
ERROR_CHARS = 2000


def alert_notices_queue(alert: Alert) -> list[AlertNotification]:
    """For a high-severity alert, one notice per configured channel, sent by the worker once the alert commits."""
    if severity_of(alert.kind) != "high":
        return []
    targets = []
    if settings.ALERT_EMAILS:
        targets.append((AlertNotification.Channel.EMAIL, ", ".join(settings.ALERT_EMAILS)))
    if settings.ALERT_WEBHOOK_URL:
        targets.append((AlertNotification.Channel.WEBHOOK, _shown_url(settings.ALERT_WEBHOOK_URL)))
    notices = [AlertNotification.objects.create(alert=alert, channel=c, target=t) for c, t in targets]
    for notice in notices:
        enqueue_after_commit(
            DELIVER_ALERT_NOTICE, notice.pk, on_failure=lambda error, pk=notice.pk: notice_unsent(pk, error)
        )
    return notices


def notice_unsent(notice_id: int, error: Exception) -> None:
    """The broker refused the notice: it is marked failed (and shown), not silently dropped."""
    AlertNotification.objects.filter(pk=notice_id).update(
        state=AlertNotification.State.FAILED, last_error=f"not queued, the broker refused it: {error}"[:ERROR_CHARS]
    )


def notice_deliver(notice_id: int, *, final: bool) -> bool:
    """Try to deliver one notice; True when it is delivered (now or before). A failure is recorded on the row,
    ``failed`` when this was the ``final`` try, else ``retrying``; False tells the task to retry."""
    notice = AlertNotification.objects.select_related("alert__prover", "alert__chip").get(pk=notice_id)
    if notice.state == AlertNotification.State.SENT:
        return True  # a redelivered message: the receiver has it already
    notice.attempts += 1
    try:
        (_send_email if notice.channel == AlertNotification.Channel.EMAIL else _send_webhook)(notice)
    except Exception as error:
        notice.state = AlertNotification.State.FAILED if final else AlertNotification.State.RETRYING
        notice.last_error = f"try {notice.attempts}: {type(error).__name__}: {error}"[:ERROR_CHARS]
        notice.save(update_fields=["state", "attempts", "last_error"])
        return False
    notice.state, notice.sent_at = AlertNotification.State.SENT, timezone.now()
    notice.save(update_fields=["state", "attempts", "sent_at"])
    return True


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
