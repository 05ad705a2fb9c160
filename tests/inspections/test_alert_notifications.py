"""Notices of high alerts: a webhook posted to a real local HTTP server, signed as docs/regulator.md says (the
receiver's check is ``inspections.webhooks.webhook_verify``); retried with backoff, a failure kept and shown; an
email through Django's mail backend (locmem here)."""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core import mail

from inspections import tasks
from inspections.models import AlertNotification
from inspections.services import notifications
from inspections.services.alerts import alert_act, alert_raise
from inspections.webhooks import SIGNATURE_HEADER, SignatureInvalid, webhook_signature, webhook_verify
from registry.models import Organisation
from tests.inspections.factories import make_provers

pytestmark = pytest.mark.django_db
SECRET = "whsec-test-0123456789"


class Receiver(BaseHTTPRequestHandler):
    """Answers each POST with the next status of ``statuses`` (then 200) and keeps what it got; with ``hold`` set,
    only once the test releases it."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.received.append((dict(self.headers), body))
        if self.server.hold:  # (arrived, release): tell the test a request is in, answer once it says so
            arrived, release = self.server.hold
            arrived.set()
            release.wait(30)
        status = self.server.statuses.pop(0) if self.server.statuses else 200
        self.send_response(status)
        if status in (301, 302, 307):
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    server.received, server.statuses, server.hold = [], [], None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{server.server_address[1]}/hooks/chipledger"
    settings.ALERT_WEBHOOK_SECRET = SECRET
    settings.ALERT_NOTIFY_TRIES = 3
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def high_alert():
    make_provers()
    return lambda: alert_raise("refused", Organisation.objects.get(slug="owner-a"), "the owner refused entry")


def test_the_webhook_is_signed_over_timestamp_and_body_and_the_receiver_can_check_it(receiver, high_alert):
    alert = high_alert()
    alert_act(alert, action="comment", by="ana", reason="private: called the owner's lawyer")
    (notice,) = AlertNotification.objects.filter(channel="webhook")
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True
    (headers, body), now = receiver.received[0], time.time()
    assert headers["Content-Type"] == "application/json" and headers["Chipledger-Delivery"] == str(notice.pk)
    signed_at = webhook_verify(SECRET, headers[SIGNATURE_HEADER], body, now)
    assert abs(now - signed_at) < 60
    sent = json.loads(body)
    assert sent["type"] == "alert.raised" and sent["alert"]["seq"] == alert.raised_seq
    assert sent["alert"]["severity"] == "high" and sent["alert"]["url"].endswith(f"/desk/alert/{alert.pk}/")
    assert b"lawyer" not in body  # case text never leaves the desk
    with pytest.raises(SignatureInvalid, match="does not match"):
        webhook_verify(SECRET, headers[SIGNATURE_HEADER], body + b" ", now)
    with pytest.raises(SignatureInvalid, match="does not match"):
        webhook_verify("another secret", headers[SIGNATURE_HEADER], body, now)
    with pytest.raises(SignatureInvalid, match="from now"):
        webhook_verify(SECRET, headers[SIGNATURE_HEADER], body, now + 3600)
    notice.refresh_from_db()
    assert (notice.state, notice.attempts, notice.last_error) == ("sent", 1, "")


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body():
    """The documented construction, checked against a value computed independently (openssl dgst -sha256 -hmac)."""
    # printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac k
    expected = "1b6ad1bc9bf48c52ce01939866d5877c6cc4e87ddad27e16673cb8c4964394a3"
    assert webhook_signature("k", 1700000000, b'{"a":1}') == f"t=1700000000,v1={expected}"


def test_a_failing_receiver_is_retried_with_backoff_then_delivered(receiver, high_alert):
    receiver.statuses = [500, 503]
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True
    notice.refresh_from_db()
    assert (notice.state, notice.attempts) == ("sent", 3) and len(receiver.received) == 3
    assert "try 2: HTTPError: HTTP Error 503" in notice.last_error  # the last failure stays visible


def test_a_receiver_that_keeps_failing_is_marked_failed_with_its_error(receiver, high_alert):
    receiver.statuses = [500, 500, 500, 500]
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is False
    notice.refresh_from_db()
    assert (notice.state, notice.attempts) == ("failed", 3) and "HTTP Error 500" in notice.last_error
    assert len(receiver.received) == 3  # ALERT_NOTIFY_TRIES, no more


def test_a_redirect_is_a_failure_not_a_post_elsewhere(receiver, high_alert, settings):
    settings.ALERT_NOTIFY_TRIES = 1
    receiver.statuses = [302]
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is False
    notice.refresh_from_db()
    assert notice.state == "failed" and "302" in notice.last_error


@pytest.mark.parametrize(
    ("url", "secret", "why"),
    [("file:///etc/passwd", SECRET, "http(s) URL"), ("http://127.0.0.1:9/x", "", "ALERT_WEBHOOK_SECRET is not set")],
)
def test_a_misconfigured_webhook_fails_visibly_and_reads_nothing(settings, high_alert, url, secret, why):
    settings.ALERT_WEBHOOK_URL, settings.ALERT_WEBHOOK_SECRET, settings.ALERT_NOTIFY_TRIES = url, secret, 1
    notice = AlertNotification.objects.get(alert=high_alert(), channel="webhook")
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is False
    notice.refresh_from_db()
    assert notice.state == "failed" and why in notice.last_error


def test_the_backoff_doubles_from_the_base_up_to_an_hour(settings):
    settings.ALERT_NOTIFY_BACKOFF = 30
    assert [notifications.notice_backoff(n) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert notifications.notice_backoff(20) == 3600


def test_an_email_goes_through_django_mail_to_the_configured_recipients(settings, high_alert):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.ALERT_EMAILS = ["duty@regulator.example", "lead@regulator.example"]
    alert = high_alert()
    (notice,) = AlertNotification.objects.filter(alert=alert)
    assert notice.channel == "email" and notice.target == "duty@regulator.example, lead@regulator.example"
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True
    (sent,) = mail.outbox
    assert sent.to == settings.ALERT_EMAILS and sent.subject == "[chipledger] high alert: Refused (owner-a)"
    assert f"seq: {alert.raised_seq}" in sent.body and f"/desk/alert/{alert.pk}/" in sent.body
    # delivered once: a redelivered task message sends nothing more
    assert tasks.deliver_alert_notice.apply(args=[notice.pk]).get() is True and len(mail.outbox) == 1


def test_the_receivers_check_in_the_docs_accepts_our_signature_and_nothing_else():
    """docs/regulator.md's verifier, run as printed, against ``webhook_signature``."""
    text = (Path(django_settings.BASE_DIR) / "docs" / "regulator.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "def verify" in block]
    namespace = {}
    exec(code, namespace)  # our own documentation
    body, now = b'{"type":"alert.raised"}', int(time.time())
    header = webhook_signature(SECRET, now, body)
    assert namespace["verify"](SECRET, header, body) is True
    assert namespace["verify"](SECRET, header, body + b"x") is False
    assert namespace["verify"]("wrong", header, body) is False
    assert namespace["verify"](SECRET, webhook_signature(SECRET, now - 900, body), body) is False
