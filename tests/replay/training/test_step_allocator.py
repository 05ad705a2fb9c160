"""The step allocator (replay/training/step_allocator.py): torch's CPU blocks of 64 KiB and more, in a recording or
replaying process, kept mapped and reused best fit, split and merged in segments of their own; free blocks given
back at the end of a run of steps and under an address-space cap; the same bits with it as without."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replay.training import native, step_allocator

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20
PAGE = 4096

needs_allocator = pytest.mark.skipif(
    step_allocator.compiler() is None or not sys.platform.startswith("linux"),
    reason="the step allocator needs a C++ compiler (and mmap)",
)


def _run(script: str, *args: str, env: dict | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def installed():
    native.tune_allocator()
    assert step_allocator.install(), "a C++ compiler is here, and yet the step allocator did not install"
    assert step_allocator.stats()["large_min"] == 64 << 10


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


@pytest.mark.kernel_independent
@needs_allocator
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            # glibc's (under 64 KiB), a segment's split pieces (under 2 MiB: a new segment's rounding), whole segments
            st.one_of(st.integers(1, (64 << 10) - 1), st.integers(64 << 10, 2 * MIB), st.integers(2 * MIB, 24 * MIB)),
            st.integers(0, 1 << 30),
        ),
        min_size=1,
        max_size=40,
    )
)
@example(ops=[(True, 2 * MIB - PAGE, 0)])  # a new segment's last page left over: a block of its own
def test_blocks_never_overlap_and_free_neighbours_always_merge(installed, ops):
    """Any order of allocations (1 byte to 24 MiB, mostly not whole pages: the small ones glibc's) and frees: after
    every one the allocator's own invariants hold (`check`: links, no two free neighbours, the free set, the byte
    counts), its live bytes grow by exactly the page-rounded sizes alive of its own, and no block overwrote
    another."""
    base, large = step_allocator.stats()["live"], step_allocator.stats()["large_min"]
    alive: list[tuple[torch.Tensor, int]] = []
    for n, (allocate, size, pick) in enumerate(ops):
        if allocate or not alive:
            alive.append((torch.empty(size, dtype=torch.uint8).fill_(n % 251), n % 251))
        else:
            alive.pop(pick % len(alive))
        assert step_allocator.check() == 0
        assert step_allocator.stats()["live"] - base == sum(_pages(t.numel()) for t, _ in alive if t.numel() >= large)
    assert all(bool((t == fill).all()) for t, fill in alive)
    alive.clear()
    assert step_allocator.stats()["live"] == base
    assert step_allocator.check() == 0


_REUSE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from replay.training import native, step_allocator, train
native.tune_allocator()
M = 1 << 20
out = {"installed": step_allocator.install()}
a = torch.empty(3 * M + 5, dtype=torch.uint8).fill_(1)
at = a.data_ptr()
b = torch.empty(5 * M, dtype=torch.uint8).fill_(2)
out["two"] = step_allocator.stats()
del a
c = torch.empty(2 * M, dtype=torch.uint8).fill_(3)  # best fit: the freed 3 MiB block, split
out["reused"] = c.data_ptr() == at
out["b_intact"] = int(b.min()) == 2 == int(b.max())  # (no temporary: b == 2 would be a block of its own)
del b, c
out["all_free"] = step_allocator.stats()
def resident():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))
with train.frozen_heap():
    big = torch.empty(200 * M, dtype=torch.uint8).fill_(4)
    kept = torch.empty(64 << 10, dtype=torch.uint8).fill_(6)  # a run's final state: in big's segment once big goes
    del big
    kept2 = torch.empty(64 << 10, dtype=torch.uint8).fill_(8)
    out["inside"] = step_allocator.stats()
    before = resident()
out["after_loop"] = step_allocator.stats()
out["resident_given_back"] = before - resident()
out["kept_intact"] = int(kept.min()) == 6 == int(kept.max()) and int(kept2.min()) == 8 == int(kept2.max())
del kept, kept2
step_allocator.release()
out["all_released"] = step_allocator.stats()
t = torch.empty(4 * M, dtype=torch.uint8)  # a 4 MiB segment, then three 1 MiB blocks at its start
del t
a, b, c = (torch.empty(M, dtype=torch.uint8).fill_(n) for n in (1, 2, 3))
del b
step_allocator.release()  # b's block, between a and c, and the free tail after c: a hole cuts the segment in two
out["hole"] = step_allocator.stats()
out["hole_check"] = step_allocator.check()
out["a_c_intact"] = int(a.min()) == 1 == int(a.max()) and int(c.min()) == 3 == int(c.max())
del a, c
out["huge"] = []
for n in (1 << 55, 1 << 62, (1 << 63) - 1, (1 << 56) + 1):  # no address space has room; no rounding may wrap
    try:
        torch.empty(n, dtype=torch.uint8)
        out["huge"].append("allocated")
    except RuntimeError as exc:
        out["huge"].append(str(exc)[:200])
out["check"] = step_allocator.check()
print(json.dumps(out))
"""


@pytest.mark.kernel_independent
@needs_allocator
def test_a_freed_block_is_reused_in_place_and_a_run_gives_its_segments_back():
    got = _run(_REUSE)
    assert got["installed"]
    two = got["two"]
    assert (two["segments"], two["mapped"], two["live"]) == (2, 4 * MIB + 6 * MIB, _pages(3 * MIB + 5) + 5 * MIB)
    assert got["reused"] and got["b_intact"]
    assert got["all_free"]["live"] == 0 and got["all_free"]["segments"] == 2  # kept mapped for the next step
    assert got["all_free"]["free_blocks"] == 2  # each segment merged back into one block
    assert got["inside"]["mapped"] >= 200 * MIB
    # the loop's end unmaps the free blocks around the two it left: their pages go back, theirs stay
    assert got["after_loop"]["mapped"] == got["after_loop"]["live"] == 2 * (64 << 10)
    assert got["resident_given_back"] >= 190 * MIB and got["kept_intact"]
    assert got["all_released"]["mapped"] == got["all_released"]["segments"] == 0
    hole = got["hole"]
    assert (hole["segments"], hole["mapped"], hole["live"]) == (2, 2 * MIB, 2 * MIB) and got["hole_check"] == 0
    assert got["a_c_intact"]
    assert all("memory" in e.lower() for e in got["huge"]), got["huge"]
    assert got["check"] == 0


_CAPPED = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import torch
from replay.training import native, step_allocator
M = 1 << 20
native.tune_allocator()
step_allocator.install()
out = {}
a = torch.empty(96 * M, dtype=torch.uint8).fill_(1)  # (a parallel fill: the thread team made before the cap is set)
del a  # kept mapped
pin = torch.empty(64 << 10, dtype=torch.uint8).fill_(9)  # best fit: the freed segment's first 64 KiB, the rest free
# the cap set here, from what is mapped now (a thread or an arena made earlier counts in it, not against the room):
# 44 MiB beyond, room for `b` only once the free block beside `pin` goes back (then 20 MiB to spare)
size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + 44 * M, resource.RLIM_INFINITY))
b = torch.empty(120 * M, dtype=torch.uint8).fill_(2)
out["after_120"] = step_allocator.stats()
out["pin_intact"] = int(pin.min()) == 9 == int(pin.max())
try:
    torch.empty(400 * M, dtype=torch.uint8)
    out["too_big"] = "allocated"
except RuntimeError as exc:
    out["too_big"] = str(exc)[:200]
out["b_intact"] = int(b.min()) == 2 == int(b.max())
out["check"] = step_allocator.check()
c = torch.empty(4 * M, dtype=torch.uint8).fill_(3)
out["later"] = int(c.min()) == 3 == int(c.max())
print(json.dumps(out))
"""


@pytest.mark.kernel_independent
@needs_allocator
def test_under_an_address_space_cap_free_segments_make_room_and_a_block_beyond_it_is_a_clear_error():
    """The verifier's subprocess runs under RLIMIT_AS: a block that fits only once the free blocks are unmapped, one
    of them beside a block still in use, gets them unmapped; one that fits nowhere is torch's own out-of-memory
    error, and the process goes on."""
    got = _run(_CAPPED)
    after = got["after_120"]
    assert after["segments"] == 2 and after["mapped"] == after["live"] == 120 * MIB + (64 << 10)
    assert "memory" in got["too_big"].lower(), got["too_big"]
    assert got["b_intact"] and got["pin_intact"] and got["check"] == 0 and got["later"]


_FORKS = """
import json, os, select, signal, sys, threading
sys.path.insert(0, sys.argv[1])
import torch
from replay.training import native, step_allocator
M = 1 << 20
native.tune_allocator()
step_allocator.install()
# the child's ops run once here first: an op's first call initialises its handle under a C++ static guard, and a
# fork landing while the other thread holds that guard (its own first torch.empty) left a child waiting on it for
# ever (gdb: __cxa_guard_acquire in at::_ops::empty_memory_format::call): torch's, not the allocator's lock. On a
# few bytes: a tensor large enough for OpenMP would start libgomp's threads here, which a forked child's parallel
# fill_ then waits for at its barrier for ever (libgomp is not fork-safe once its pool exists)
warm = torch.empty(16, dtype=torch.uint8).fill_(7)
assert int(warm.min()) == 7 == int(warm.max())
del warm
stop = threading.Event()
def churn():  # the lock held through release's munmaps of 200 holes (ctypes lets the GIL go): forks land inside it
    while not stop.is_set():
        blocks = [torch.empty(64 << 10, dtype=torch.uint8) for _ in range(400)]
        del blocks[::2]
        step_allocator.release()
worker = threading.Thread(target=churn)
worker.start()
codes = []
for _ in range(60):
    pid = os.fork()
    if pid == 0:  # the child allocates at once: a lock inherited held would hang it
        t = torch.empty(5 * M, dtype=torch.uint8).fill_(7)
        os._exit(0 if int(t.min()) == 7 == int(t.max()) and step_allocator.check() == 0 else 1)
    exited = os.pidfd_open(pid)
    ended = select.select([exited], [], [], 10)[0]  # readable once the child has exited
    os.close(exited)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    codes.append(status if ended else "hung")
stop.set()
worker.join()
print(json.dumps({"codes": codes}))
"""


@pytest.mark.kernel_independent
@needs_allocator
def test_a_process_forked_while_another_thread_allocates_can_allocate():
    """A Celery pool forks its children; the allocator's lock is held across the fork and let go on both sides."""
    assert set(_run(_FORKS)["codes"]) == {0}


_RECORD = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from replay.training import architectures as models, step_allocator
from replay.training.determinism import Rounder, encode_log
from replay.training.train import initial_state, train_step
from replay.training.bundled_data import Batches
from replay.prover.recorder import DEFAULT_OPTIMIZER
cfg = {"in_channels": 3, "image": 16, "channels": [16, 32], "classes": 10}
model, opt = models.build("cnn", cfg), DEFAULT_OPTIMIZER["cnn"]
state = initial_state(models.init_params("cnn", cfg, 0), opt)
h = hashlib.sha256()
for t in range(2):
    rounder = Rounder("record")
    state, loss = train_step(model, state, Batches("cnn", cfg, 64, 0)(t), opt, "det64", rounder)
    h.update(encode_log(rounder.entries))
for name, p in sorted(state.tensors().items()):
    h.update(name.encode() + p.numpy().tobytes())
print(json.dumps({"sha": h.hexdigest(), "allocator": step_allocator.stats() is not None}))
"""


@needs_allocator
def test_a_recording_is_the_same_bits_with_the_step_allocator_and_without():
    with_it, without = _run(_RECORD), _run(_RECORD, env={"REPLAY_ALLOCATOR": "0"})
    assert with_it["allocator"] and not without["allocator"]
    assert with_it["sha"] == without["sha"]


_NO_COMPILER = """
import json, sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
from replay.training import native, step_allocator
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    native.tune_allocator()
t = torch.empty(8 << 20, dtype=torch.uint8).fill_(5)
print(json.dumps({"installed": step_allocator.install(), "stats": step_allocator.stats(),
                  "warned": [str(w.message)[:80] for w in caught], "ok": int(t.min()) == 5 == int(t.max())}))
"""


@pytest.mark.kernel_independent
def test_without_a_cxx_compiler_the_step_allocator_is_skipped_with_a_warning(tmp_path):
    got = _run(_NO_COMPILER, env={"CXX": str(tmp_path / "no-such-c++"), "REPLAY_NATIVE_CACHE": str(tmp_path)})
    assert not got["installed"] and got["stats"] is None and got["ok"]
    assert any("step allocator unavailable" in w for w in got["warned"]), got["warned"]
