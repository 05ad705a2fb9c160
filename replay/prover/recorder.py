"""The prover's side: train an allow-listed architecture and write its transcript.

    Recorder(out, "gpt", steps=100).run()

writes manifest.json, checkpoints, segments (batches and rounding logs), snapshots.jsonl (the
chips' signed firmware logs), chips.json (their public keys; in production these come from the
registry, not from the prover) and claims.json (the prover's answer for every logged snapshot:
which step produced it).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from replay.protocol import hashing, limits
from replay.protocol import manifest_schema as schema
from replay.protocol.firmware import Firmware
from replay.protocol.transcript_layout import (
    FORMAT,
    batch_digest,
    checkpoint_steps,
    op_digests,
    state_digests,
    write_checkpoint,
    write_manifest,
    write_segment,
)
from replay.prover import listed
from replay.training import architectures as models
from replay.training import bundled_data as data
from replay.training.determinism import Rounder, encode_log
from replay.training.train import State, frozen_heap, initial_state, train_step

COMMITMENTS = ("ops", "steps", "none")
DEFAULT_INTERVAL = 10  # steps between checkpoints, or the whole run when it is shorter
MAX_SNAPSHOT_RATE = 10.0  # Poisson events per chip per step: above ~5 a chip logs at nearly every step
DEFAULT_BATCH = {"mlp": 64, "cnn": 32, "gpt": 16}
DEFAULT_OPTIMIZER = {
    "mlp": {
        "kind": "sgd",
        "lr": {"kind": "step", "lr": 0.05, "gamma": 0.5, "every": 50},
        "momentum": 0.9,
        "weight_decay": 0.0,
    },
    "cnn": {"kind": "sgd", "lr": {"kind": "constant", "lr": 0.02}, "momentum": 0.9, "weight_decay": 0.0001},
    "gpt": {
        "kind": "adamw",
        "lr": {"kind": "linear", "lr": 0.003, "warmup": 10, "total": 1000, "final": 0.0003},
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.01,
    },
}


def _integer_in(value, lo: int, hi: int, option: str, why: str = "") -> None:
    if type(value) is not int or not lo <= value <= hi:
        raise ValueError(f"{option} must be an integer in [{lo}, {hi}]{why}, not {value!r}")


def check_options(steps, interval, batch, seed, chips, snapshot_rate) -> None:
    """Refuse, before anything is written, a run whose transcript a verifier would call malformed: the bounds
    are the manifest schema's own (replay/protocol/manifest_schema.py). ``chips``: a count, or the serials.
    ValueError names the record command's option and its range."""
    _integer_in(steps, 1, schema.MAX_STEPS, "--steps")
    _integer_in(interval, 1, steps, "--checkpoint-interval", " (at most --steps)")
    _integer_in(batch, 1, schema.MAX_BATCH, "--batch")
    _integer_in(seed, 0, schema.MAX_SEED, "--seed")
    if isinstance(chips, int):
        _integer_in(chips, 1, schema.MAX_SHARDS, "--chips")
    else:
        if not 1 <= len(chips) <= schema.MAX_SHARDS:
            raise ValueError(f"--serials must name 1 to {schema.MAX_SHARDS} chips, not {len(chips)}")
        if "" in chips:
            raise ValueError("--serials names an empty serial (a stray comma?)")
        for serial in chips:
            problem = schema.serial_problem(serial)
            if problem:
                raise ValueError(f"--serials: {str(serial)[:80]!r} {problem}")
        repeated = sorted(s for s, n in Counter(chips).items() if n > 1)
        if repeated:  # one chip cannot hold two shards: the verifier would refuse the layout
            raise ValueError(f"--serials names {listed(repeated)} more than once")
    rate = snapshot_rate
    if type(rate) not in (int, float) or not math.isfinite(rate) or not 0 <= rate <= MAX_SNAPSHOT_RATE:
        raise ValueError(f"--snapshot-rate must be a number in [0, {MAX_SNAPSHOT_RATE:g}], not {rate!r}")


def check_out(out) -> None:
    """Refuse an --out that is not a new or empty folder (ValueError naming it): a transcript is never
    overwritten, nor mixed with another run's files (an old checkpoint left beside a new manifest)."""
    out = Path(out)
    try:
        _check_out(out)
    except OSError as e:  # a name too long, a path through a file
        raise ValueError(f"--out {out}: {e.strerror or e}") from None


def _check_out(out: Path) -> None:
    if out.exists() or out.is_symlink():
        if out.is_symlink():  # (a transcript is written where it is named, not through a link)
            raise ValueError(f"--out {out} is a symbolic link: name the folder itself")
        if not out.is_dir():
            raise ValueError(f"--out {out} is not a folder")
        try:
            held = sorted(p.name for p in out.iterdir())
        except OSError as e:
            raise ValueError(f"--out {out}: cannot read it ({e.strerror})") from None
        if held:
            raise ValueError(
                f"--out {out} already holds {', '.join(held[:3])}{', ...' if len(held) > 3 else ''}: give a new or "
                "empty folder (record never overwrites a transcript)"
            )
        return
    parent = next(p for p in out.absolute().parents if p.exists() or p.is_symlink())
    if parent.is_symlink() and not parent.exists():
        raise ValueError(f"--out {out}: {parent} is a broken link")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: cannot create a folder under {parent}")


class Recorder:
    """Trains `arch` for `steps` steps and writes the transcript to `out`."""

    def __init__(
        self,
        out,
        arch: str,
        *,
        steps: int,
        seed: int = 0,
        chips: int = 4,
        config: dict | None = None,
        optimizer: dict | None = None,
        batch: int | None = None,
        checkpoint_interval: int | None = None,
        precision: str = "det64",
        snapshot_rate: float = 0.05,
        progress: bool = False,
        batches=None,
        serials: list[str] | None = None,
        firmware=None,
        device: str = "cpu",
        commitments: str | None = None,
    ):
        self.out, self.arch, self.steps, self.seed = Path(out), arch, steps, seed
        self.config = config or models.DEFAULTS[arch]
        self.optimizer = optimizer or DEFAULT_OPTIMIZER[arch]
        self.batch = DEFAULT_BATCH[arch] if batch is None else batch
        if checkpoint_interval is None and type(steps) is int:  # the default adapts to a short run
            checkpoint_interval = min(DEFAULT_INTERVAL, max(steps, 1))
        self.interval, self.precision, self.rate, self.progress = (
            checkpoint_interval,
            precision,
            snapshot_rate,
            progress,
        )
        check_options(
            steps, checkpoint_interval, self.batch, seed, chips if serials is None else serials, snapshot_rate
        )
        if precision not in schema.PRECISIONS:
            raise ValueError(f"--precision {precision!r}: use one of {', '.join(schema.PRECISIONS)}")
        self.serials = serials or [f"SIM-{seed:04d}-{i:03d}" for i in range(chips)]
        # firmware(layout, seed, rate) -> Firmware: the chips' own firmware (replay.prover.chipsim); default simulated.
        self.firmware = firmware or Firmware
        self._batches = batches  # the run's data: made once the run is checked (`batches`)
        self.step_seconds: list[float] = []  # the prover's time per training step (for benchmarks)
        self.device = limits.resolve_device(device)
        # per-step commitments for dispute bisection (transcript_layout.py): "steps" (the default: each tensor of
        # the state after each step, a hash per tensor, a few percent of a step), "ops" (and every rounded output
        # of each step: the first divergent operation exactly, at about twice the recording time) or "none"
        self.commitments = commitments or "steps"
        if self.commitments not in COMMITMENTS:
            raise ValueError(f"commitments {commitments!r}: use one of {', '.join(COMMITMENTS)}")

    @property
    def batches(self):
        """The run's data, made on first use: after `check`, so that a run over the budgets is refused before its
        dataset is built (a 44 GiB step's took 14 s and 1.9 GB to refuse)."""
        if self._batches is None:
            self._batches = data.Batches(self.arch, self.config, self.batch, self.seed)
        return self._batches

    def draw(self, t: int):
        """(batch of step t, its inclusion proofs): the sampler's draw. A cheating prover overrides this."""
        return self.batches.draw(t)

    def rounder(self, t: int) -> Rounder | None:
        """The rounder of step t (det64), tracing every rounded output when ops are committed. A cheat overrides it."""
        if self.precision != "det64":
            return None
        return Rounder("record", trace=[] if self.commitments == "ops" else None)

    def after_step(self, model, state):
        """The state after a step, as recorded. A cheating prover overrides this."""
        return state

    def commit(self, state, rounder) -> tuple[bytes | None, bytes | None]:
        """(state digest, op digests) of a step as recorded, per `commitments`."""
        if self.commitments == "none":
            return None, None
        ops = op_digests(rounder.trace) if rounder is not None and rounder.trace is not None else None
        return state_digests(state), ops

    def check(self) -> None:
        """Refuse, before anything is allocated, a run beyond the replay budgets of this device
        (replay/protocol/limits.py): what the prover records, a verifier of the same kind can replay."""
        spec = models.batch_spec(self.arch, self.config, self.batch)
        reason = limits.step_limits(self.arch, self.config, spec, self.device)
        if reason:
            raise ValueError(reason)

    def check_log(self, t: int, log: bytes | None, rounder) -> None:
        """A log over the verifier's caps would make the run unverifiable: stop rather than record it."""
        if log is None:
            return
        max_bytes, max_entries = limits.log_caps(
            self.arch, self.config, models.batch_spec(self.arch, self.config, self.batch)
        )
        entries = rounder.entry_count()
        if len(log) > max_bytes or entries > max_entries:
            raise ValueError(
                f"step {t}: the rounding log holds {entries} entries in {len(log)} bytes, more than a verifier "
                f"reads ({max_entries} entries, {max_bytes} bytes): please report this run"
            )

    def check_params(self, t: int, state: State) -> None:
        """An update must leave finite parameters: a NaN's sign and payload are not IEEE's to fix (CPUs, GPUs
        and the native kernel may differ), so a checkpoint or snapshot holding one would not verify bit for bit
        elsewhere. The next step's loss does not always show one: the last update has none, and an embedding's
        row no batch reads leaves it finite. A pass over the parameters, as the snapshot hashes' each step."""
        finite = [torch.isfinite(p).all() for p in state.params.values()]
        if not bool(torch.stack(finite).all()):
            raise ValueError(
                f"step {t}: the update left non-finite parameters, which a transcript does not record: training "
                f"diverged (a lower learning rate); {self.out} holds an incomplete recording"
            )

    def run(self) -> Path:
        """Record the run: its transcript's folder."""
        with frozen_heap():
            return self._record()

    def _record(self) -> Path:
        self.check()
        self.batches  # noqa: B018 (made before --out is: a dataset that cannot be made leaves no folder behind)
        out = self.out
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # (a folder check_out let through that the system refuses: /proc, a read-only mount)
            raise ValueError(f"--out {out}: cannot create it ({e.strerror or e})") from None
        model = models.build(self.arch, self.config)
        state = initial_state(models.init_params(self.arch, self.config, self.seed), self.optimizer)
        state = state.to(self.device)
        layout = hashing.shard_layout(sum(p.numel() for p in state.params.values()), self.serials)
        firmware = self.firmware(layout, self.seed, self.rate)
        firmware.step_flops = models.training_flops(
            self.arch, self.config, models.batch_spec(self.arch, self.config, self.batch)
        )
        stops = checkpoint_steps(self.steps, self.interval)
        records, checkpoints, segments, segment, claims = [], {}, {}, [], []
        checkpoints["0"] = write_checkpoint(out, state)
        for t in tqdm(range(self.steps), desc=f"record {self.arch}", disable=not self.progress, file=sys.stderr):
            batch, proofs = self.draw(t)
            started = time.perf_counter()
            rounder = self.rounder(t)
            state, loss = train_step(model, state, batch, self.optimizer, self.precision, rounder)
            if not 0 <= loss <= schema.MAX_LOSS:  # NaN too: a manifest holds none, and no verifier replays it
                raise ValueError(
                    f"step {t}: the loss is {loss}, outside the [0, {schema.MAX_LOSS:g}] a transcript records: "
                    f"training diverged (a lower learning rate); {out} holds an incomplete recording"
                )
            self.check_params(t, state)
            state = self.after_step(model, state)
            log = encode_log(rounder.log()) if rounder is not None else None
            self.check_log(t, log, rounder)
            self.step_seconds.append(time.perf_counter() - started)
            records.append({"data": batch_digest(batch), "loss": loss})
            segment.append((t, batch, proofs, log, *self.commit(state, rounder)))
            hashes = hashing.shard_hashes(state.params, layout)
            logged = firmware.tick(state.step, hashes)
            if t == self.steps - 1:
                logged += firmware.finish(state.step, hashes)
            for chip, rec in logged:
                claims.append(
                    {
                        "serial": chip.serial,
                        "counter": rec["counter"],
                        "shard": rec["shard"],
                        "hash": rec["hash"],
                        "step": state.step,
                        "time": rec["time"],
                    }
                )
            if state.step in stops:
                segments[str(segment[0][0])] = write_segment(out, segment[0][0], segment)
                checkpoints[str(state.step)] = write_checkpoint(out, state)
                segment = []
        spec = models.batch_spec(self.arch, self.config, self.batch)
        manifest = {
            "format": FORMAT,
            "arch": self.arch,
            "config": self.config,
            "precision": self.precision,
            "seed": self.seed,
            "optimizer": self.optimizer,
            "batch": {k: {"dtype": d, "shape": s} for k, (d, s) in spec.items()},
            "steps": self.steps,
            "checkpoint_interval": self.interval,
            "shards": layout,
            "dataset": self.batches.data.commitment(),
            "reported_flops": self.steps * models.training_flops(self.arch, self.config, spec),
            "records": records,
            "checkpoints": checkpoints,
            "segments": segments,
        }
        manifest_hash = write_manifest(out, manifest)
        (out / "snapshots.jsonl").write_text("".join(line + "\n" for line in firmware.lines))
        (out / "chips.json").write_text(json.dumps(firmware.public_keys(), indent=1) + "\n")
        (out / "claims.json").write_text(json.dumps({"manifest": manifest_hash, "claims": claims}, indent=1) + "\n")
        return out
