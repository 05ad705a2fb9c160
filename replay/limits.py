"""What one training step of a manifest costs the verifier, bounded before anything runs.

    reason = step_limits(arch, config, spec)   # None, or why the manifest is refused

The allow-list bounds parameters, not activations: a GPT with block 1024 and batch 4096 passes
every config bound yet needs ~10^11 float64 attention scores at step 0. So the working set of one
deterministic step and its FLOPs are estimated from the architecture config and the batch shape,
and a manifest above either limit is malformed (the reason names the batch shape and the figure).

The estimate counts the float64 elements a step keeps for backward (outputs of every op, the
attention score and probability matrices, im2col columns of convolutions, the logits and their
softmax) and charges ACT_FACTOR bytes per element: 8 for the value, 8 for its gradient or a
rounding-point temporary of the same size. It is an estimate of scale (within ~2x), not an
allocator's figure; the limits leave that margin under the worker's memory limit.
"""

from __future__ import annotations

from . import models

MAX_STEP_ACTIVATION_BYTES = 2 << 30
MAX_STEP_FLOPS = 1e12
ACT_FACTOR = 16


def activation_elements(arch: str, config: dict, spec: dict) -> int:
    """Float64 elements one step keeps live for backward, from the config and the batch shape."""
    shape = spec["x"][1]
    b = shape[0]
    if arch == "mlp":
        return 2 * b * sum(config["sizes"])
    if arch == "cnn":
        side, chans, total = config["image"], [config["in_channels"], *config["channels"]], 0
        total = b * chans[0] * side * side
        for i, (ci, co) in enumerate(zip(chans[:-1], chans[1:])):
            side = (side + 2 - 3) // (1 if i == 0 else 2) + 1
            total += b * side * side * (9 * ci + 2 * co)  # im2col columns, conv output, relu
        return total + 2 * b * config["classes"]
    t, c, h = shape[1], config["n_embd"], config["n_head"]
    per_layer = b * t * c * 17 + 2 * b * h * t * t  # ln, qkv, heads, proj, mlp 4c x2, residuals; scores, probs
    return b * t * c * 3 + config["n_layer"] * per_layer + 2 * b * t * config["vocab"]


def step_limits(arch: str, config: dict, spec: dict) -> str | None:
    """Why one step of this manifest is beyond the verifier's limits, or None."""
    shape = spec["x"][1]
    act = activation_elements(arch, config, spec) * ACT_FACTOR
    if act > MAX_STEP_ACTIVATION_BYTES:
        return (
            f"batch.x.shape {shape} with this config needs about {act / 2**30:.1f} GiB of activations per "
            f"step, more than the verifier's limit of {MAX_STEP_ACTIVATION_BYTES / 2**30:.0f} GiB"
        )
    flops = models.training_flops(arch, config, spec)
    if flops > MAX_STEP_FLOPS:
        return (
            f"batch.x.shape {shape} with this config is {flops:.3e} FLOPs per training step, more than the "
            f"verifier's limit of {MAX_STEP_FLOPS:.0e}"
        )
    return None
