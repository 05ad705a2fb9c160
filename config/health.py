"""GET /healthz: database, broker, ledger head and the periodic tasks' heartbeats, as JSON; 200 if all are
up, else 503 naming what is down or stale."""

from django.db import connection
from django.http import JsonResponse

from config.celery import app as celery_app
from desk.services.heartbeats import stale_tasks
from ledger import selectors


def _database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"ok": True, "vendor": connection.vendor}


def _broker() -> dict:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
        return {"ok": True, "transport": conn.transport_cls}


def _ledger() -> dict:
    size = selectors.ledger_size()
    latest = selectors.checkpoint_latest()
    report = {
        "ok": True,
        "size": size,
        "checkpoint_size": latest.size if latest else None,
        "checkpoint_root": bytes(latest.root).hex() if latest else None,
        "unsigned_entries": size - (latest.size if latest else 0),
    }
    if latest is not None:
        problem = selectors.checkpoint_problem(size, latest)
        if problem:
            report.update(ok=False, error=problem, unsigned_entries=max(report["unsigned_entries"], 0))
    return report


def _periodic() -> dict:
    """Beat sends, a worker runs: a periodic task two intervals overdue means one of them stopped."""
    stale = stale_tasks()
    if stale:
        return {"ok": False, "error": "beat or worker stopped: " + "; ".join(stale), "stale": stale}
    return {"ok": True}


def healthz(request):
    report = {}
    checks = (("database", _database), ("broker", _broker), ("ledger", _ledger), ("periodic", _periodic))
    for name, check in checks:
        try:
            report[name] = check()
        except Exception as error:  # a health check reports failures, it does not raise them
            report[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
    healthy = all(part["ok"] for part in report.values())
    return JsonResponse({"ok": healthy, **report}, status=200 if healthy else 503)
