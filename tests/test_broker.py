"""The embedded broker (config/broker.py): kombu's filesystem transport, delivering as before, stopping at once."""

from __future__ import annotations

import time

import pytest
from celery.worker import state
from kombu import Connection, Exchange, Queue

from config.broker import Transport


@pytest.fixture
def connection(tmp_path):
    folders = {name: tmp_path / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir()
    options = {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
    }
    with Connection("filesystem://", transport=Transport, transport_options=options) as conn:
        yield conn


@pytest.fixture
def stop_flag():
    yield state
    state.should_stop = None


def test_a_published_message_is_delivered(connection):
    queue = Queue("t", Exchange("t"), routing_key="t")
    got = []
    with connection.Consumer(queue, callbacks=[lambda body, message: (got.append(body), message.ack())]):
        connection.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key="t", declare=[queue])
        connection.drain_events(timeout=5)
    assert got == [{"n": 1}]


def test_an_idle_wait_ends_within_a_nap_once_the_worker_is_told_to_stop(connection, stop_flag):
    queue = Queue("idle", Exchange("idle"), routing_key="idle")
    with connection.Consumer(queue, callbacks=[]):
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            connection.drain_events(timeout=0.3)  # nothing to deliver: the full wait, as kombu's
        assert time.monotonic() - began >= 0.3
        stop_flag.should_stop = 0  # a warm shutdown's exit code is 0: still a stop
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            connection.drain_events(timeout=30)
        assert time.monotonic() - began < 1
