"""The Proof-of-Training-Data screen (replay/protocol/screen.py): false alarms on honest runs, detection of
fabricated and interpolated checkpoints, per bundled architecture.

    .venv/bin/python bench/screen.py                   # 5 seeds per architecture
    .venv/bin/python bench/screen.py --seeds 10 --steps 40 --interval 4

Per seed: an honest det64 run (the CLI's default config, batch and optimizer) of --steps steps with
a checkpoint every --interval; the screen over it counts false alarms among its checked
checkpoints. Then, for each checkpoint in the middle half of the run, two forgeries, screened as a
whole transcript with only that checkpoint replaced:
  * fabricated: the state of a run trained elsewhere (same init, another data seed) for 10x the
    steps the checkpoint declares;
  * interpolated: the midpoint of its two honest neighbours plus Gaussian noise of 1% of their
    distance per coordinate.
Detection rate = forged checkpoints flagged / forged checkpoints. Prints a markdown table.

Row "mlp-memorize": the MLP on a pool of 4,096 random inputs with random labels (Recorder's
`batches`), where everything learnable is memorisation: the case the screen's signature is made for.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from replay.protocol.screen import Z_FLAG, screen  # noqa: E402
from replay.protocol.transcript import Transcript  # noqa: E402
from replay.prover.recorder import DEFAULT_BATCH, DEFAULT_OPTIMIZER, Recorder  # noqa: E402
from replay.training import architectures as models  # noqa: E402
from replay.training.bundled_data import Batches  # noqa: E402
from replay.training.train import initial_state, train_step  # noqa: E402


class Memorize:
    """Batches from a fixed pool of random inputs with uniformly random labels (pure memorisation)."""

    def __init__(self, cfg: dict, batch: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(4096, cfg["sizes"][0], generator=gen)
        self.y = torch.randint(0, cfg["sizes"][-1], (4096,), generator=gen)
        self.batch, self.seed = batch, seed

    def __call__(self, t: int) -> dict:
        idx = torch.randint(0, 4096, (self.batch,), generator=torch.Generator().manual_seed(self.seed * 100_003 + t))
        return {"x": self.x[idx].contiguous(), "y": self.y[idx].contiguous()}


ROWS = {"mlp": "mlp", "cnn": "cnn", "gpt": "gpt", "mlp-memorize": "mlp"}


class Forged:
    """A transcript with one checkpoint's parameters replaced (in memory: the screen reads only these)."""

    def __init__(self, tr: Transcript, step: int, params: dict):
        self.tr, self.step, self.forged = tr, step, params

    def __getattr__(self, name):
        return getattr(self.tr, name)

    def params(self, step: int) -> dict:
        return self.forged if step == self.step else self.tr.params(step)


def batches_for(row: str, seed: int):
    arch = ROWS[row]
    cfg, b = models.DEFAULTS[arch], DEFAULT_BATCH[arch]
    return Memorize(cfg, b, seed) if row == "mlp-memorize" else Batches(arch, cfg, b, seed)


def trained_elsewhere(row: str, steps: int, seed: int) -> dict:
    """Parameters after `steps` float32 steps on another data seed, from the same initialisation."""
    arch = ROWS[row]
    cfg, opt = models.DEFAULTS[arch], DEFAULT_OPTIMIZER[arch]
    model, batches = models.build(arch, cfg), batches_for(row, 10_000 + seed)
    state = initial_state(models.init_params(arch, cfg, seed), opt)
    for t in range(steps):
        state, _ = train_step(model, state, batches(t), opt, "float32")
    return state.params


def interpolated(tr: Transcript, k: int, gen: torch.Generator) -> dict:
    a, b = tr.params(tr.checkpoints[k - 1]), tr.params(tr.checkpoints[k + 1])
    out = {}
    for name in a:
        mid, dist = (a[name] + b[name]) / 2, (b[name] - a[name]).abs()
        out[name] = mid + torch.randn(mid.shape, generator=gen) * dist * 0.01
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--interval", type=int, default=4)
    p.add_argument("--arch", nargs="*", default=list(ROWS), choices=list(ROWS))
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"Z_FLAG = {Z_FLAG}; {args.seeds} seeds x {args.steps} steps, checkpoint every {args.interval}\n")
    print(
        "| arch | honest checkpoints checked | false alarms | min honest z | fabricated flagged | "
        "interpolated flagged | max forged z |"
    )
    print("|---|---|---|---|---|---|---|")
    for arch in args.arch:
        checked = alarms = fab_n = fab_hit = int_n = int_hit = 0
        honest_z, forged_z, zs = [], [], {}
        started = time.perf_counter()
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as d:
                Recorder(
                    Path(d) / "t",
                    ROWS[arch],
                    steps=args.steps,
                    seed=seed,
                    checkpoint_interval=args.interval,
                    batches=batches_for(arch, seed),
                ).run()
                tr = Transcript(Path(d) / "t")
                r = screen(tr)
                checked, alarms = checked + r["checked"], alarms + len(r["flagged"])
                honest_z += list(r["z"].values())
                n = len(tr.checkpoints) - 1
                gen = torch.Generator().manual_seed(seed)
                for k in range(max(1, n // 4), max(2, 3 * n // 4)):
                    c = tr.checkpoints[k]
                    for kind, params in (
                        ("fab", trained_elsewhere(arch, 10 * c, seed)),
                        ("int", interpolated(tr, k, gen)),
                    ):
                        f = screen(Forged(tr, c, params))
                        forged_z.append(float(f["z"][str(c)]))
                        zs.setdefault(kind, []).append(float(f["z"][str(c)]))
                        hit = c in f["flagged"]
                        if kind == "fab":
                            fab_n, fab_hit = fab_n + 1, fab_hit + hit
                        else:
                            int_n, int_hit = int_n + 1, int_hit + hit
        print(
            f"| {arch} | {checked} | {alarms} | {min(honest_z):.2f} | {fab_hit}/{fab_n} ({100 * fab_hit / fab_n:.0f}%) | "
            f"{int_hit}/{int_n} ({100 * int_hit / int_n:.0f}%) | {max(forged_z):.2f} |",
            flush=True,
        )
        zs["honest"] = honest_z
        for kind, v in zs.items():
            print(f"<!-- {arch} {kind} z: " + " ".join(f"{x:.1f}" for x in sorted(v)) + " -->", file=sys.stderr)
        print(f"<!-- {arch}: {time.perf_counter() - started:.0f} s -->", file=sys.stderr)


if __name__ == "__main__":
    main()
