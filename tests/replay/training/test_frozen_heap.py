"""The heap alive when a loop of training steps starts is kept out of the cyclic collector's full passes while it
runs (a det64 step's short-lived objects set one off every few hundred steps: 80-110 ms over torch's modules),
and given back after; a process that froze its own heap (a Celery worker) keeps it frozen."""

import gc
import threading

import pytest

from replay.protocol.engine import Budget, Replayer
from replay.protocol.transcript import Transcript
from replay.training import train
from replay.training.train import frozen_heap
from tests.replay.helpers import INTERVAL, record


@pytest.fixture
def thawed():
    """A process with nothing frozen, as the CLI's; frozen again after the test where it was before (a test
    module that loads config.wsgi freezes the suite's process)."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    yield
    gc.unfreeze()
    if frozen:
        gc.freeze()


def test_the_loop_runs_frozen_and_gives_the_heap_back(thawed):
    with frozen_heap():
        assert gc.get_freeze_count() > 1000  # torch's modules, pytest's, ours
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("a step failed")
    assert gc.get_freeze_count() == 0


def test_nested_loops_and_threads_give_the_heap_back_when_the_last_is_out(thawed):
    started, leave = threading.Event(), threading.Event()

    def other_loop():
        with frozen_heap():
            started.set()
            leave.wait(10)

    with frozen_heap():
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 1000  # the inner loop's exit gave nothing back
        other = threading.Thread(target=other_loop)
        other.start()
        started.wait(10)
    assert gc.get_freeze_count() > 1000  # the other thread's loop still runs
    leave.set()
    other.join(10)
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_heap_keeps_it_frozen(thawed):
    gc.freeze()  # as config/celery.py does once a worker is ready
    before = gc.get_freeze_count()
    with frozen_heap():
        pass
    # Not given back (that would leave 0); not exactly `before` either: a frozen object whose last reference goes
    # (a module cache's entry, a thread's frame) leaves the permanent generation in a large process.
    assert before > 1000 and gc.get_freeze_count() > before // 2


def test_recording_and_replaying_step_with_the_heap_frozen(tmp_path, monkeypatch, thawed):
    seen = []
    real = train.train_step

    def watched(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return real(*args, **kwargs)

    monkeypatch.setattr("replay.prover.recorder.train_step", watched)
    monkeypatch.setattr("replay.protocol.engine.train_step", watched)
    d = record(tmp_path / "t", "mlp")
    recorded = len(seen)
    Replayer(Transcript(d), Budget()).run(0, INTERVAL)
    assert recorded > 0 and len(seen) == recorded + INTERVAL
    assert min(seen) > 1000
    assert gc.get_freeze_count() == 0
