"""Tiny transcripts and the tools an attacker would use to edit them consistently."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import safetensors.torch
import torch

from replay import Recorder
from replay.protocol.transcript_layout import batch_digest, canonical_json, checkpoint_path, segment_path, sha256
from replay.training import native

TINY = {
    "mlp": {"config": {"sizes": [16, 48, 48, 4]}, "batch": 32},
    "cnn": {"config": {"in_channels": 1, "image": 8, "channels": [4, 8], "classes": 4}, "batch": 16},
    "gpt": {"config": {"vocab": 32, "block": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}, "batch": 8},
}
STEPS, INTERVAL = 12, 4


def record(out: Path, arch: str, precision: str = "det64", threads: int = 1, recorder=Recorder, **kw) -> Path:
    """Record a tiny transcript with `threads` torch threads (restored afterwards); `recorder` may be a cheat."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        args = {
            "steps": STEPS,
            "checkpoint_interval": INTERVAL,
            "precision": precision,
            "snapshot_rate": 0.3,
            "config": TINY[arch]["config"],
            "batch": TINY[arch]["batch"],
            **kw,
        }
        return recorder(out, arch, **args).run()
    finally:
        torch.set_num_threads(before)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_bytes())


def save_manifest(d: Path, m: dict) -> None:
    """Write the manifest and re-point claims.json at it, as a cheating prover would."""
    data = canonical_json(m)
    (d / "manifest.json").write_bytes(data)
    claims = json.loads((d / "claims.json").read_text())
    claims["manifest"] = sha256(data)
    (d / "claims.json").write_text(json.dumps(claims))


def edit_segment(d: Path, start: int, fn, *, recommit: bool | str = True) -> None:
    """fn(tensors dict) edits a segment file in place; recommit: True updates the data digests and the
    file hash in the manifest, "file" only the file hash, False nothing."""
    path = segment_path(d, start)
    tensors = dict(safetensors.torch.load(path.read_bytes()))
    fn(tensors)
    path.write_bytes(safetensors.torch.save(tensors))
    if recommit:
        m = manifest(d)
        for key in tensors if recommit is True else ():
            if key.startswith("x:"):
                t = int(key[2:])
                m["records"][t]["data"] = batch_digest({"x": tensors[f"x:{t}"], "y": tensors[f"y:{t}"]})
        m["segments"][str(start)] = sha256(path.read_bytes())
        save_manifest(d, m)


def edit_checkpoint(d: Path, step: int, fn, *, recommit: bool = True) -> None:
    path = checkpoint_path(d, step)
    tensors = dict(safetensors.torch.load(path.read_bytes()))
    fn(tensors)
    path.write_bytes(safetensors.torch.save(tensors))
    if recommit:
        m = manifest(d)
        m["checkpoints"][str(step)] = sha256(path.read_bytes())
        save_manifest(d, m)


def claims(d: Path) -> dict:
    return json.loads((d / "claims.json").read_text())


class ManyCheckpoints:
    """A stand-in transcript with n checkpoints of a wide MLP, made up on the fly (nothing on disk): for
    measuring what the whole-transcript checks hold in memory as the number of checkpoints grows."""

    def __init__(self, n: int, sizes=(64, 2048, 256, 4)):
        from replay.training import architectures as models
        from replay.training.train import initial_state

        self.arch, self.config, self.steps = "mlp", {"sizes": list(sizes)}, n
        sgd = {"kind": "sgd", "lr": {"kind": "constant", "lr": 0.01}, "momentum": 0.0, "weight_decay": 0.0}
        self.manifest = {"seed": 0, "optimizer": sgd, "records": [{"loss": 2.0 - t / n} for t in range(n)]}
        self.checkpoints = list(range(n + 1))
        self.init = initial_state(models.init_params(self.arch, self.config, 0), sgd)

    def segment(self, start: int) -> list:
        return []

    def checkpoint(self, step: int):
        from replay.training.train import State

        if step == 0:
            return self.init
        gen = torch.Generator().manual_seed(step)
        params = {k: v + torch.randn(v.shape, generator=gen) * 1e-3 for k, v in self.init.params.items()}
        return State(step, params, {"momentum": {k: torch.zeros_like(v) for k, v in params.items()}})

    def params(self, step: int):
        return self.checkpoint(step).params

    def differing_tensor(self, step: int, state):
        from replay.protocol.bisect import first_differing_tensor

        return first_differing_tensor(state, self.checkpoint(step))


@contextlib.contextmanager
def kernel_threads(n: int):
    """The native kernel's parallel paths at any size: n torch threads (more than this machine may have
    cores), no size floor."""
    before, floor = torch.get_num_threads(), native.PARALLEL_MIN
    torch.set_num_threads(n)
    native.PARALLEL_MIN = 0
    try:
        yield
    finally:
        torch.set_num_threads(before)
        native.PARALLEL_MIN = floor


def gpt_steps_with_and_without_kernel(monkeypatch, seed: int, threads: int) -> None:
    """A TINY gpt's three recorded steps with the native kernel and on the torch path, on `threads` threads:
    the same logs and state; and the first step's log replays to the recorded state with the kernel on and off."""
    from replay.prover.recorder import DEFAULT_OPTIMIZER
    from replay.training import architectures as models
    from replay.training.bundled_data import Batches
    from replay.training.determinism import Rounder, decode_log, encode_log
    from replay.training.train import initial_state, train_step

    cfg, opt = TINY["gpt"]["config"], DEFAULT_OPTIMIZER["gpt"]
    model = models.build("gpt", cfg)
    state = initial_state(models.init_params("gpt", cfg, seed), opt)
    batch = Batches("gpt", cfg, TINY["gpt"]["batch"], seed)(0)
    before, lib_on = torch.get_num_threads(), native.library()
    torch.set_num_threads(threads)
    try:
        results = []
        for lib in (lib_on, False):
            monkeypatch.setattr(native, "_LIB", lib)
            s, logs = state, []
            for _ in range(3):
                r = Rounder("record")
                s, loss = train_step(model, s, batch, opt, "det64", r)
                logs.append((loss, encode_log(r.entries)))
            results.append((s, logs))
        (s0, logs0), (s1, logs1) = results
        assert s0.equal(s1) and logs0 == logs1
        want, _ = train_step(model, state, batch, opt, "det64", Rounder("record"))
        for lib in (lib_on, False):
            monkeypatch.setattr(native, "_LIB", lib)
            got, _ = train_step(model, state, batch, opt, "det64", Rounder("replay", entries=decode_log(logs0[0][1])))
            assert got.equal(want)
    finally:
        torch.set_num_threads(before)


def doctored_points(entries: dict, keys, doctor: str | None) -> dict:
    """entries with the points `keys` doctored: "parity" flips every parity there (the other float32 in each window),
    "wide" makes each one's first entry a wide entry naming a float32 far outside its window; else as they were."""
    out = dict(entries)
    for k in keys:
        idx, codes = out[k]
        if doctor == "parity":
            out[k] = (idx, [not c if isinstance(c, bool) else c for c in codes])
        elif doctor == "wide":
            out[k] = (idx, [(1 << 32) | 0x7F000000, *codes[1:]])
    return out


def doctored_entries(entries: dict, doctor: str | None, outputs: int) -> tuple[list, list]:
    """Point 0's recorded log entries (one entry at 0 where none), doctored as the one-call replay tests doctor
    them: "parity" flips the last entry's parity, "wide" makes the first a wide entry naming a float32 far away,
    "past" names an index past the outputs, "many" more entries than allowed, "unsorted" reverses them,
    "codes" leaves one code short; any other (None, "window") leaves them as recorded."""
    from replay.training.determinism import entry_cap

    idx, codes = entries.get(0, ([0], [False]))
    idx, codes = list(idx), list(codes)
    if doctor == "parity":
        codes[-1] = not codes[-1] if isinstance(codes[-1], bool) else codes[-1]
    elif doctor == "wide":
        codes[0] = (1 << 32) | 0x7F000000
    elif doctor == "past":
        idx[-1] = outputs + 5
    elif doctor == "many":
        idx, codes = list(range(entry_cap(outputs) + 1)), [False] * (entry_cap(outputs) + 1)
    elif doctor == "unsorted" and len(idx) > 1:
        idx, codes = idx[::-1], codes[::-1]
    elif doctor == "codes":
        idx = idx + [idx[-1]]  # one code short
    return idx, codes
