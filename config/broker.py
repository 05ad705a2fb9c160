"""The embedded broker of `make run` (no REDIS_URL): kombu's filesystem transport, stopping promptly.

kombu's polling transports wait inside ``drain_events``: Celery's loop asks for up to 2 s, and kombu
sleeps its polling interval (1 s) between looks at the queue folder. A worker told to stop (Ctrl-C,
SIGTERM) noticed only when that wait ended, up to 3 s later. Here the wait between looks is cut
into short naps that end as soon as Celery's worker state says stop; messages are looked for as often
as before.
"""

from __future__ import annotations

import time

from celery.worker import state
from kombu.transport import filesystem
from kombu.transport.virtual.base import Empty

NAP_SECONDS = 0.05


def worker_stopping() -> bool:
    """True once the worker's signal handler asked for a warm or cold shutdown (exit codes may be 0)."""
    return any(flag is not None and flag is not False for flag in (state.should_stop, state.should_terminate))


class Transport(filesystem.Transport):
    def drain_events(self, connection, timeout=None):
        began = time.monotonic()
        while True:
            try:
                return self.cycle.get(self._deliver, timeout=timeout)
            except Empty:
                pass
            waited = time.monotonic() - began
            if worker_stopping() or (timeout is not None and waited >= timeout):
                raise TimeoutError()
            pause = self.polling_interval if timeout is None else min(self.polling_interval, timeout - waited)
            nap_until = time.monotonic() + pause
            while time.monotonic() < nap_until and not worker_stopping():
                time.sleep(NAP_SECONDS)
