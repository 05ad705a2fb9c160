"""A training transcript opened for verification, and its strict reader. Everything read here is hostile
until verified (docs/transcripts.md; the layout on disk is transcript_layout.py).

Reading never unpickles (JSON and safetensors only), checks every size against the manifest before
reading, parses safetensors headers itself before handing the bytes to safetensors (transcript_files.py),
and takes architectures only from the allow-list (manifest_schema.py). Anything malformed raises
MalformedTranscript(reason); a well-formed file that does not match its commitment raises
CommitmentMismatch (the prover changed something after committing). A well-formed manifest whose step costs
more than this verifier's budgets is read (`beyond_budget` says why) but not replayed (engine.Replayer).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from replay.protocol import limits
from replay.protocol.fetch_limits import MAX_MANIFEST_BYTES
from replay.protocol.hashing import same_bits
from replay.protocol.manifest_schema import validate_manifest
from replay.protocol.transcript_errors import CommitmentMismatch, MalformedTranscript
from replay.protocol.transcript_files import DTYPES, MAX_HEADER_BYTES, NAMES, read_file, read_safetensors
from replay.protocol.transcript_layout import (
    batch_digest,
    canonical_json,
    checkpoint_path,
    checkpoint_steps,
    parse_op_digests,
    segment_path,
    sha256,
)
from replay.training import architectures as models
from replay.training import data_commitment as dataset
from replay.training.train import OPTIMIZERS, State

MAX_OPS_BYTES = 4 << 20  # per step: 104,857 rounded outputs' digests


class Transcript:
    """A transcript directory opened for verification: the manifest validated, files read on demand."""

    def __init__(self, root: str | Path, device=None):
        """`device`: where it will be replayed, whose budgets bound a step (default REPLAY_DEVICE)."""
        self.root = Path(root)
        data = read_file(self.root / "manifest.json", MAX_MANIFEST_BYTES, self.root)
        try:
            m = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
            raise MalformedTranscript(f"manifest.json is not JSON ({type(e).__name__})") from None
        self.spec = validate_manifest(m)
        if canonical_json(m) != data:
            raise MalformedTranscript("manifest.json is not in canonical form (sorted keys, no spaces, no duplicates)")
        # why a step is beyond this verifier's budgets (this machine's limit, not the prover's fault), or None:
        # what needs no replay is still checked; the Replayer refuses (BeyondThisVerifier)
        self.beyond_budget = limits.step_limits(m["arch"], m["config"], self.spec, device)
        self.manifest, self.hash = m, sha256(data)
        self.arch, self.config, self.precision = m["arch"], m["config"], m["precision"]
        self.shapes = models.param_shapes(self.arch, self.config)
        self.names = list(self.shapes)
        self.buffers = OPTIMIZERS[m["optimizer"]["kind"]]
        self.steps = m["steps"]
        self.checkpoints = checkpoint_steps(self.steps, m["checkpoint_interval"])
        self.layout = m["shards"]
        self.log_bytes, self.log_entries = limits.log_caps(self.arch, self.config, self.spec)

    def segment_start(self, step: int) -> int:
        """The checkpoint at or before `step` (for step < steps: the start of the segment holding step)."""
        return max(c for c in self.checkpoints if c <= step)

    def next_checkpoint(self, step: int) -> int:
        return min(c for c in self.checkpoints if c > step)

    def checkpoint(self, step: int) -> State:
        """The training state committed at `step` (parameters and optimizer buffers), streamed per tensor."""
        return State.from_tensors(step, self._checkpoint_tensors(step), self.names, self.buffers)

    def params(self, step: int) -> dict[str, torch.Tensor]:
        """Only the parameters committed at `step` (the whole file is still read and hashed; the optimizer
        buffers, two thirds of an AdamW checkpoint, are dropped as they are read)."""
        tensors = self._checkpoint_tensors(step, lambda key, tensor: key.startswith("param:"))
        return {k: tensors[f"param:{k}"] for k in self.names}

    def differing_tensor(self, step: int, state: State) -> str | None:
        """The first tensor of `state` (in State.tensors() order) whose bits differ from the checkpoint at
        `step`, or None when every bit agrees; compared as each is read, so only one is held at a time."""
        ours, seen, differing = state.tensors(), set(), set()

        def compare(key: str, tensor: torch.Tensor) -> bool:
            seen.add(key)
            if key not in ours or not same_bits(ours[key], tensor):
                differing.add(key)
            return False

        self._checkpoint_tensors(step, compare)
        differing |= set(ours) - seen
        return next((k for k in [*ours, *sorted(differing)] if k in differing), None)

    def _checkpoint_tensors(self, step: int, keep=lambda key, tensor: True) -> dict[str, torch.Tensor]:
        expected = {}
        for k, s in self.shapes.items():
            for prefix in ("param", *self.buffers):
                expected[f"{prefix}:{k}"] = ("float32", s)
        limit = sum(4 * math.prod(s) for s in self.shapes.values()) * (1 + len(self.buffers)) + MAX_HEADER_BYTES + 8
        digest = self.manifest["checkpoints"][str(step)]
        return read_safetensors(checkpoint_path(self.root, step), self.root, limit, digest, expected, keep)

    def segment(self, start: int) -> list[tuple[int, dict, bytes | None]]:
        """[(t, batch, rounding log bytes or None)] for the steps of the segment starting at `start`.

        Every batch must be the sampler's draw from the committed dataset (inclusion proofs checked)
        with its inputs inside the declared range."""
        end = self.next_checkpoint(start)
        tensors = self._segment_tensors(start)
        out = []
        for t in range(start, end):
            batch = {"x": tensors[f"x:{t}"], "y": tensors[f"y:{t}"]}
            if batch_digest(batch) != self.manifest["records"][t]["data"]:
                raise CommitmentMismatch(f"the batch of step {t} does not match its data commitment")
            _check_labels(self, batch, t)
            d = self.manifest["dataset"]
            proof = bytes(tensors[f"proof:{t}"].numpy())
            why = dataset.check_batch(batch, proof, self.manifest["seed"], bytes.fromhex(d["root"]), d["size"], t)
            if why is not None:
                raise CommitmentMismatch(f"the batch of step {t} is not the committed sampler's: {why}")
            log = bytes(tensors[f"log:{t}"].numpy()) if self.precision == "det64" else None
            out.append((t, batch, log))
        return out

    def step_commitments(self, start: int) -> dict[int, tuple[bytes | None, dict[int, bytes] | None]]:
        """{t: (the state's tensor digests after step t, {op key: output digest})} of the segment starting at
        `start`, as the prover committed them (each None where absent or not well formed): what a dispute bisects
        against (transcript_layout.state_digests, op_digests)."""
        tensors = self._segment_tensors(start)
        out = {}
        for t in range(start, self.next_checkpoint(start)):
            state = tensors.get(f"state:{t}")
            ops = tensors.get(f"ops:{t}")
            out[t] = (
                None if state is None else bytes(state.numpy()),
                None if ops is None else parse_op_digests(bytes(ops.numpy())),
            )
        return out

    def _segment_tensors(self, start: int) -> dict:
        """The segment file's tensors, its header checked against the manifest and its bytes against their hash."""
        end = self.next_checkpoint(start)
        expected, optional, limit = {}, set(), MAX_HEADER_BYTES + 8
        d, batch = self.manifest["dataset"], self.spec["y"][1][0]
        seed, root = self.manifest["seed"], bytes.fromhex(d["root"])
        tensors = len(self.names) * (1 + len(self.buffers))  # a state's tensors: parameters and optimizer buffers
        for t in range(start, end):
            for k in ("x", "y"):
                dtype, shape = self.spec[k]
                expected[f"{k}:{t}"] = (dtype, shape)
                limit += math.prod(shape) * DTYPES[NAMES[dtype]].itemsize
            n = dataset.proof_bytes(seed, root, t, batch, d["size"])
            expected[f"proof:{t}"] = ("uint8", [n])
            limit += n
            if self.precision == "det64":
                expected[f"log:{t}"] = ("uint8", self.log_bytes)
                limit += self.log_bytes
            # the optional per-step commitments (transcript_layout.py): a dispute's bisection, never a verdict
            expected[f"state:{t}"], expected[f"ops:{t}"] = ("uint8", [32 * tensors]), ("uint8", MAX_OPS_BYTES)
            optional |= {f"state:{t}", f"ops:{t}"}
            limit += 32 * tensors + MAX_OPS_BYTES
        digest = self.manifest["segments"][str(start)]
        return read_safetensors(segment_path(self.root, start), self.root, limit, digest, expected, optional=optional)


def _check_labels(tr: Transcript, batch: dict, t: int) -> None:
    """Token ids and class labels must be in range (an out-of-range index would crash the replay)."""
    hi = (
        tr.config["vocab"]
        if tr.arch == "gpt"
        else (tr.config["sizes"][-1] if tr.arch == "mlp" else tr.config["classes"])
    )
    for k in ("y",) + (("x",) if tr.arch == "gpt" else ()):
        v = batch[k]
        if v.numel() and (int(v.min()) < 0 or int(v.max()) >= hi):
            raise MalformedTranscript(f"step {t}: {k} holds ids outside [0, {hi})")
    if batch["x"].is_floating_point():
        lo, hi = tr.manifest["dataset"]["x_range"]
        x = batch["x"]
        if not bool(torch.isfinite(x).all()):
            raise MalformedTranscript(f"step {t}: x holds non-finite values")
        if x.numel() and (float(x.min()) < lo or float(x.max()) > hi):
            raise MalformedTranscript(f"step {t}: x holds values outside the declared dataset.x_range [{lo}, {hi}]")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")
