"""A step's rounding log in fixed slots: replay with static shapes, so that a GPU can run it as one graph.

Why. The deferred replay (`Rounder._apply_deferred`) applies each rounding point's log entries with
element-wise ops whose sizes are the entries' count at that point: a different shape every step,
which no CUDA graph can hold, so a replayed step launches ~45,000 kernels one by one (15M GPT:
40 ms of GPU work in 390 ms, bench/RESULTS.md). Here every rounding point has a fixed number of
slots (`slots(n)`, every output of a crowded point); each step the host lays the log's entries
into them (one copy to the device), pads the rest, and the same ops run at every point, entries or
not: the same decisions and states as the deferred replay (tests/replay/training/test_static_log.py;
windows formed in another order can differ in their last bits, as between machines).

A padded slot of a point with entries repeats the point's first entry and writes that entry's value,
taken from the entry's own slot, so that every write to one output carries the same bits (a device
scatter with repeated indices picks any of them); a point without entries writes its own rounding
back. The layout is learnt from one replayed step of the model (the same ops every step); a step the
layout does not fit (a point with more entries than slots, an entry the step has no point for) is
replayed the deferred way, which refuses what it must with its usual reasons.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

STATIC_MIN = 1 << 12  # log entries a step's table holds at least
_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {shape key: Layout}
_DENSE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> keys given every output as a slot
_OFF: weakref.WeakSet = weakref.WeakSet()  # models whose static replay ran out of memory


@dataclass
class Slots:
    """One step's entries spread over every slot (device tensors, valid for that step)."""

    idx: torch.Tensor  # flat output index per slot (padding: the point's first entry, or 0)
    code: torch.Tensor  # the entry's code (a parity bit, or a wide entry's float32 bits as int32)
    wide: torch.Tensor  # bool
    valid: torch.Tensor  # bool: a real entry (checked), not padding
    has: torch.Tensor  # bool: the slot's point has entries this step
    src: torch.Tensor  # the slot (within its point) whose value it writes: its own, or the first entry's


@dataclass
class Layout:
    """Where each rounding point's slots lie in a step's table, and the table itself."""

    order: list  # [(key, outputs)] of the step's rounding points, in call order
    points: dict  # key -> (offset, slots, outputs)
    total: int
    cap: int  # entries the table holds
    device: torch.device
    slot_point: torch.Tensor = field(init=False)  # point index per slot, and one trash slot at the end
    local: torch.Tensor = field(init=False)  # each slot's place within its point
    table: torch.Tensor = field(init=False)  # the step's entries: dest, idx, code, wide (cap each), first idx, has
    host: torch.Tensor = field(init=False)
    crowded: list = field(default_factory=list)  # points a step gave more entries than slots (not more than allowed)

    def __post_init__(self):
        sizes = [k for _, k, _ in self.points.values()]
        point = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
        first = torch.tensor([off for off, _, _ in self.points.values()], dtype=torch.long)
        self.local = (torch.arange(self.total) - first[point]).to(self.device)
        self.slot_point = torch.cat([point, torch.tensor([0])]).to(self.device)
        n = 4 * self.cap + 2 * len(sizes)
        self.table = torch.zeros(n, dtype=torch.long, device=self.device)
        self.host = torch.zeros(n, dtype=torch.long, pin_memory=self.device.type == "cuda")
        # the points by key, for `fill`'s lookups: sorted keys, each one's row (call order), (offset, slots, outputs)
        keys = np.array(list(self.points), dtype=np.int64)
        self._by_key = np.argsort(keys, kind="stable")
        self._sorted_keys = keys[self._by_key]
        self._meta = np.array(list(self.points.values()), dtype=np.int64).reshape(-1, 3)

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row in the layout (call order), or -1 where the layout has no such point."""
        if not len(self._sorted_keys):
            return np.full(len(keys), -1, dtype=np.int64)
        at = np.searchsorted(self._sorted_keys, keys).clip(max=len(self._sorted_keys) - 1)
        return np.where(self._sorted_keys[at] == keys, self._by_key[at], -1)

    def fill(self, log) -> bool:
        """Lay a step's entries (a determinism.FlatLog: each key's strictly increasing indices and codes)
        into the table, in a few array passes; False where they do not fit (the step is then replayed
        the deferred way, which refuses what it must). A point with more entries than slots (and no
        more than allowed) is noted in `crowded`: the first such point in key order, where no point
        before it is refused."""
        from replay.training.determinism import WIDE_CODE, entry_cap

        cap, p, t = self.cap, len(self.points), log.total
        rows = self._rows(log.keys)
        if t > cap or (rows < 0).any():
            return False
        off, k, n = self._meta[rows].T
        m = log.counts
        refused = (m > entry_cap(n)) | (log.idx[log.starts + m - 1] >= n)
        crowded = m > k
        if (refused | crowded).any():
            j = int(np.argmax(refused | crowded))
            if not refused[j]:
                self.crowded.append(int(log.keys[j]))
            return False
        h = self.host.numpy()
        # each entry's slot: its point's offset plus its place among the point's entries; padding
        # entries land in the trash slot (whatever their other fields held before: nothing reads it)
        h[:t] = np.repeat(off - log.starts, m) + np.arange(t)
        h[t:cap] = self.total
        h[cap : cap + t] = log.idx
        wide = log.codes >= WIDE_CODE
        bits = log.codes & 0xFFFFFFFF
        h[2 * cap : 2 * cap + t] = np.where(wide, np.where(bits >= 1 << 31, bits - (1 << 32), bits), log.codes)
        h[3 * cap : 3 * cap + t] = wide
        h[4 * cap :] = 0
        h[4 * cap + rows] = log.idx[log.starts]
        h[4 * cap + p + rows] = 1
        self.table.copy_(self.host, non_blocking=True)
        return True

    def expand(self) -> Slots:
        """The table spread over every slot: fixed shapes, no host synchronisation."""
        cap, p, total = self.cap, len(self.points), self.total
        dest, idx, code, wide = (self.table[i * cap : (i + 1) * cap] for i in range(4))
        first_idx, has = self.table[4 * cap : 4 * cap + p], self.table[4 * cap + p :]
        slot_idx = torch.take(first_idx, self.slot_point).index_copy_(0, dest, idx)
        slot_code = torch.zeros(total + 1, dtype=torch.long, device=self.device).index_copy_(0, dest, code)
        slot_wide = torch.zeros(total + 1, dtype=torch.long, device=self.device).index_copy_(0, dest, wide)
        valid = torch.zeros(total + 1, dtype=torch.bool, device=self.device).index_fill_(0, dest, True)[:total]
        point = self.slot_point[:total]
        return Slots(
            slot_idx[:total],
            slot_code[:total],
            slot_wide[:total].bool(),
            valid,
            torch.take(has, point).bool(),
            torch.where(valid, self.local, 0),
        )


def shape_key(params32: dict, x: torch.Tensor, y: torch.Tensor, dtype) -> tuple:
    """What fixes a step's rounding points (given the model): parameter, input and label shapes."""
    shapes = tuple((k, tuple(v.shape), v.dtype) for k, v in params32.items())
    return (dtype, shapes, tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, x.device)


def usable(rounder, device: torch.device) -> bool:
    """Replays the deferred way (a GPU, or a CPU without the native kernel), nothing traced or bent."""
    from replay.training import native

    return (
        rounder is not None
        and rounder.mode == "replay"
        and rounder.defer
        and rounder.allow_static
        and not rounder.lenient
        and rounder.trace is None
        and rounder.perturb is None
        and (device.type != "cpu" or native.library() is None)
        # on a CPU (no graphs to gain) only when asked for: the tests of the path a GPU runs set it
        and os.environ.get("REPLAY_STATIC", "1" if device.type == "cuda" else "0") != "0"
    )


def prepare(model, rounder, params32: dict, x: torch.Tensor, y: torch.Tensor, dtype) -> None:
    """Before a replayed step: lay its entries into the model's layout (rounder.static), or have the
    step learn the layout (rounder.learn) where there is none yet."""
    if not usable(rounder, x.device) or model in _OFF:
        return
    dense = dense_points(model)
    key = shape_key(params32, x, y, dtype)
    layout = cached(model, key, dense)
    if layout is None:
        earlier = next((lay for (k, _), lay in _LAYOUTS.get(model, {}).items() if k == key), None)
        if earlier is None:
            rounder.learn, rounder.learn_key = [], key
            return
        layout = layout_for(model, key, earlier.order, x.device, dense)
    layout.crowded.clear()
    log = rounder.replay_log()
    if log is not None and layout.fill(log):
        rounder.static = layout
    else:  # an honest point may carry more entries than slots: every output, once the step is accepted
        rounder.crowded = list(layout.crowded)


def learnt(model, rounder) -> None:
    """After an accepted replayed step: its crowded points dense from now on (a refused log changes
    nothing), and the model's layout for such steps if the step learnt its rounding points."""
    if rounder is not None and rounder.crowded:
        dense_points(model).update(rounder.crowded)
    keys = [k for k, _ in rounder.learn or []] if rounder is not None else []
    if keys and len(set(keys)) == len(keys):  # (a point rounded twice would need two places)
        layout_for(model, rounder.learn_key, rounder.learn, rounder.learn_key[-1], dense_points(model))


def layout_for(model, key: tuple, points: list, device, dense: set) -> Layout:
    """The model's layout for steps of this shape, made from a replayed step's rounding points
    [(key, outputs)] in call order (cached)."""
    from replay.training.determinism import slots

    layouts = _LAYOUTS.setdefault(model, {})
    key = (key, frozenset(dense))
    if key not in layouts:
        at, table = 0, {}
        for point, n in points:
            k = n if point in dense else slots(n)
            table[point] = (at, k, n)
            at += k
        layouts.clear()  # one shape per model at a time: each layout holds device buffers
        layouts[key] = Layout(list(points), table, at, min(at, max(STATIC_MIN, at >> 4)), torch.device(device))
    return layouts[key]


def cached(model, key: tuple, dense: set) -> Layout | None:
    return _LAYOUTS.get(model, {}).get((key, frozenset(dense)))


def give_up(model) -> None:
    """The model's steps replay the deferred way from now on (its static replay ran out of memory)."""
    _OFF.add(model)
    _LAYOUTS.pop(model, None)


def dense_points(model) -> set:
    return _DENSE.setdefault(model, set())
