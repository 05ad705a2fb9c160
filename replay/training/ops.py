"""The op set models are written against, in two precisions.

DET: float64 compute, every reduction or transcendental rounded to float32 at once through the active
Rounder (determinism.py), with its error bound; backward passes are written out so that every
reduction in them (weight gradients, bias sums, scatter-adds) is a rounding point too. What flows
between ops that is not rounded is a chain of single IEEE operations on identical inputs, hence
identical bits on every machine.

PLAIN: ordinary float32 torch ops. The control: same model, same data, machine-dependent bits.

Each op takes a `name` (for dispute reports). Keys: op_id * SLOTS + slot; slot 0 is the forward
output, higher slots are the op's other rounding points.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from replay.training import determinism, kernels, native
from replay.training.determinism import (
    EXP_ERR,
    SAFETY,
    SLOTS,
    WIDE,
    Bound,
    U,
    abs_sum,
    active,
    gamma,
    in_chunks,
    max_of_numbers,
    norms,
    sqrt_,
    unravel,
)


def _mean(R, key: int, t: torch.Tensor, n: int, inv_n: float) -> torch.Tensor:
    """The rounding point mean(t, -1) (keepdim) as sum * (1/n), its bound gamma(n + 1) * mean(|t|) (n-term
    sum, then one multiply by 1/n)."""
    err = lambda: abs_sum(t, -1, keepdim=True) * (gamma(n + 1) / n)
    return R.full(key, t.sum(-1, keepdim=True) * inv_n, err, t.shape[:-1] + (1,))


def _no_fold(tensors):
    """Detached views. torch.matmul will not fold a broadcast 2-D @ 3-D product into one GEMM when an
    operand requires grad (it keeps the batched form for its own backward), even under no_grad, as
    inside these Functions: two to four times slower for a convolution's products here."""
    return tuple(t.detach() for t in tensors)


def _matmul_operands(tensors):
    """`_no_fold` where the two operands' dims differ (a broadcast product); equal dims fold nothing, and
    a detach is an ATen op (two per product, forward and backward)."""
    a, b = tensors
    return (a, b) if a.dim() == b.dim() else _no_fold(tensors)


PACK = True  # saved float32-valued float64 tensors kept as float32 (tests turn it off to compare)


def _save(ctx, *tensors) -> None:
    """ctx.save_for_backward, each large tensor that holds float32 values (a view of a rounding point's
    output, unchanged since: `Rounder.as_float32`) kept as float32: backward reads the same values
    (`_saved`) from half the memory. det64's own tensors are float64, so a float32 one is such a copy."""
    R, kept = active(), []
    for t in tensors:  # a loop, not comprehensions: a small model's step is mostly the Python around its points
        packed = R.as_float32(t) if PACK and t is not None and t.numel() >= determinism.PACK_MIN else None
        kept.append(t if packed is None else packed)
    ctx.save_for_backward(*kept)


def _saved(ctx) -> tuple:
    """The saved tensors, float64 again (two ATen ops a copy, where .double() is four)."""
    wide = lambda t: torch.empty(t.shape, dtype=torch.float64, device=t.device).copy_(t)
    return tuple(wide(t) if t is not None and t.dtype == torch.float32 else t for t in ctx.saved_tensors)


class _Matmul(torch.autograd.Function):
    """C = scale * (A @ B) + bias. A (..., M, K), B (..., K, N) with equal batch dims, bias (N,). weight: b is a
    linear layer's weight (N, K) and B its transpose, taken here rather than by a transpose node in the graph (a small
    model's step is mostly the overhead of its graph's nodes); its gradient is the transpose of B's."""

    @staticmethod
    def forward(ctx, a, b, bias, scale, name, weight=False):
        R = active()
        op = R.op(name)
        ctx.weight = weight
        a, b = _matmul_operands((a, b.transpose(0, 1) if weight else b))  # (two ATen ops, t() three)
        add = False
        if bias is not None and scale == 1.0 and a.dim() == b.dim() == 2:
            # the bias added after the product or inside the GEMM: a (K + 1)-term sum in some order either way, which
            # the point's bound, gamma(K + 2) (sum |A_ik B_kj| + |bias_j|), covers as it covers any order. On a CPU
            # after it, in the rounding point's own pass over C (`Rounder.dot`'s add), where addmm first copies the
            # bias into C, a pass of its own (det64 steps: mlp -1.2%, gpt -2.4%, cnn-32 -1%); on a GPU inside the GEMM
            add = a.is_cpu
            c = torch.mm(a, b) if add else torch.addmm(bias, a, b)
        else:
            c = torch.matmul(a, b)
            if scale != 1.0:
                c = c * scale
            if bias is not None:
                c = c + bias
        _save(ctx, a, b)
        ctx.op, ctx.scale, ctx.has_bias = op, scale, bias is not None
        (ra, ca), (rb, cb) = _both_norms(R, a), _both_norms(R, b)
        ctx.norms = ca, rb  # what backward's products read of a and b: a's columns (its weight gradient), b's rows
        # a linear layer's product in a CPU recording or replay on the kernel: its points straight to the kernel
        ctx.lean = scale == 1.0 and a.dim() == b.dim() == 2 and R.takes_kernel_points() and native.usable(a, b)
        if ctx.lean:
            return R.kernel_product(op * SLOTS, c, a, b, bias, (ra, cb), add)
        return R.dot(op * SLOTS, c, a, b, scale, bias, owned=True, norms=(ra, cb), add=add)

    @staticmethod
    def backward(ctx, g):
        R = active()
        a, b = _matmul_operands(_saved(ctx))
        key = ctx.op * SLOTS
        if ctx.scale != 1.0:
            g = g * ctx.scale
        (rg, cg), (ca, rb) = _both_norms(R, g), ctx.norms
        lean = ctx.lean and g.is_contiguous() and native.usable(g) and R.takes_kernel_points()
        ga = gb = gbias = None
        if ctx.needs_input_grad[0]:
            bt = b.transpose(-2, -1)
            ga = _product_point(R, key + 1, torch.matmul(g, bt), g, bt, (rg, rb), lean)
        if ctx.needs_input_grad[1]:
            gb = _b_gradient(R, key + 2, a, g, (ca, cg), ctx.weight, lean)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gbias = R.kernel_column_sums(key + 3, g) if lean else None
            if gbias is None:
                gbias = _bias_gradient(R, key + 3, g)
        return ga, gb, gbias, None, None, None


def _bias_gradient(R, key: int, g):
    """The point sum of g over all but its last dim (a bias's gradient, its bound the magnitudes' sums times
    gamma(rows)): one native pass where the rounder lets one form it (`_sums_native`), else torch's."""
    rows = g.reshape(-1, g.shape[-1])
    gbias = _sums_native(R, key, rows.unsqueeze(-1))
    if gbias is None:
        err = lambda: abs_sum(rows, 0) * gamma(rows.shape[0])
        gbias = R.full(key, rows.sum(0), err, (rows.shape[1],))
    return gbias


def _product_point(R, key: int, v, a, b, norms, lean: bool, transposed: bool = False):
    """A fresh product's point, v owned: straight to the kernel where `lean` (`_Matmul`'s: a 2-D product in a CPU
    recording or replay on the kernel, every operand CPU float64: `Rounder.kernel_product`), else through
    `Rounder.dot`'s routes."""
    if lean:
        return R.kernel_product(key, v, a, b, norms=norms, transposed=transposed)
    return R.dot(key, v, a, b, owned=True, norms=norms, transposed=transposed)


def _b_gradient(R, key: int, a, g, norms, weight: bool, lean: bool = False):
    """B's gradient A^T g, the point (K, N) (its log's indices); a linear layer's weight (`weight`) takes its
    transpose. There, on a CPU, where N <= K, the GEMM forms that transpose, g^T A, (N, K), the weight's own layout,
    and the rounder takes it as the point's transpose (`Rounder.dot`'s transposed): a CPU GEMM forms a product of few
    columns slowly (the 0.1M MLP's last layer, (256, 8) over 64 terms: 28 us, its transpose 10; the gpt's MLP, (256, 64)
    over 512: 476 us, 339), and a square one as fast either way, whose gradient the optimizer then reads as it lies, not
    transposed (the 0.1M MLP's 256 x 256: its update 41 -> 30 us at 2 threads). A widening layer keeps A^T g (its
    transpose is the slow one). On every CPU path alike (kernel or not), so that one machine's paths sum the same way."""
    at = a.transpose(-2, -1)
    if weight and a.dim() == 2 and a.is_cpu and g.shape[-1] <= a.shape[-1]:
        return _product_point(R, key, torch.mm(g.transpose(0, 1), a), at, g, norms, lean, transposed=True)
    gb = _product_point(R, key, torch.matmul(at, g), at, g, norms, lean)
    return gb.transpose(0, 1) if weight else gb  # (a weight's: 2-D)


def _both_norms(R, t: torch.Tensor) -> tuple:
    """(t's row norms, its column norms) in one pass over a large 2-D operand where the rounder hands its points'
    norms to the kernel (`Rounder.shares_norms`): a linear layer's input and gradient are each read by two points'
    norms, by rows in one and by columns in the other; else (None, None), the kernel's own."""
    both = native.row_col_norms(t) if R.shares_norms(t) else None
    return both if both is not None else (None, None)


def _sums_native(R, key: int, x: torch.Tensor):
    """The rounding point sum of x (A, O, L) over A and L, a bias's gradient (its bound the magnitudes' sum
    times gamma(A * L)), in one native pass (the sums in another order) where the rounder lets a pass round
    it (`_one_point_pass`), or the pass's sums and bounds through the rounder where a replay's log names the
    point: the rounded sums (O,), else None (the caller's reference ops)."""
    g = gamma(x.shape[0] * x.shape[2])
    run = lambda log: native.axis_sums(x, g, SAFETY, WIDE, log)
    return _one_point_pass(R, key, run, lambda: _staged(R, key, native.axis_sums_values(x, g)))


class _Softmax(torch.autograd.Function):
    """Softmax over the last dim; -inf entries (masks) give exactly 0."""

    @staticmethod
    def forward(ctx, x, name):
        R = active()
        op = R.op(name)
        p = _softmax_native(R, op * SLOTS, x)
        p = p if p is not None else _Softmax.reference(R, op * SLOTS, x)
        _save(ctx, p)
        ctx.op = op
        return p

    @staticmethod
    def reference(R, key, x):
        """p, its rounding point through the rounder: exp 2 ulps, the sum, the divide."""
        e = torch.exp(x - x.amax(-1, keepdim=True))
        p = e / e.sum(-1, keepdim=True)
        return R.full(key, p, lambda: p * gamma(x.shape[-1] + 10), p.shape)

    @staticmethod
    def backward(ctx, dp):
        R = active()
        (p,) = _saved(ctx)
        dx = _softmax_back_native(R, ctx.op * SLOTS + 1, p, dp)
        return (dx if dx is not None else _Softmax.backward_reference(R, ctx.op * SLOTS + 1, p, dp)), None

    @staticmethod
    def backward_reference(R, key, p, dp):
        """dx, its rounding point through the rounder."""
        pd = p * dp
        r = pd.sum(-1, keepdim=True)
        dx = p * (dp - r)
        return R.full(key, dx, lambda: softmax_grad_bound(p, pd, dx), dx.shape)


SOFTMAX_GRAD = (U * (1 + 2.0**-20), 1 + 2.0**-40, 4 * U)  # softmax_grad_bound's constants (c, k, u4)


def _softmax_native(R, key: int, x):
    """_Softmax's forward through the kernel's passes (torch's exp between them; the sum in another order),
    where the rounder lets it (`Rounder.fused_mode`) and the kernel takes x: p, else None. A replay whose log names
    the point takes the pass's values and bounds through the rounder (`_staged`)."""
    c = gamma(x.shape[-1] + 10)
    run = lambda log: native.softmax(x.contiguous(), c, SAFETY, WIDE, log)
    return _one_point_pass(R, key, run, lambda: _staged(R, key, native.softmax_values(x.contiguous(), c)))


def _softmax_back_native(R, key: int, p, dp):
    """_Softmax's backward in one kernel pass (r = sum(p * dp) in another order: the bound covers it), as
    `_softmax_native`: dx, else None."""
    run = lambda log: native.softmax_back(p, dp.contiguous(), SOFTMAX_GRAD, SAFETY, WIDE, log)
    return _one_point_pass(
        R, key, run, lambda: _staged(R, key, native.softmax_back_values(p, dp.contiguous(), SOFTMAX_GRAD))
    )


def _staged(R, key: int, got):
    """A pass's (values, bounds) at a point a replay's log names, through the rounder (`Rounder.full`), which
    applies the log: the values rounded; None where the kernel declined (got None: the reference's ops run). Two
    tensors of the output's size, where the softmax's reference ops make four (a GPT's replay peaked in them)."""
    return None if got is None else R.full(key, got[0], got[1], got[0].shape)


def _one_point_pass(R, key: int, run, stage=None):
    """An op's one rounding point through a native pass, run(log) -> (rounded, [close calls]) or None, where the
    rounder lets a pass round it (a recording, or a replay whose log names it not); where a replay's log names it,
    stage() -> the point through the rounder, which applies the log (`_staged`), or None (without a stage: None,
    the reference's ops). The rounded output, else None."""
    mode = R.fused_mode((key,))
    if mode == "staged":
        return stage() if stage is not None else None
    got = run(mode == "record") if mode in ("record", "plain") else None
    if got is None:
        return None
    R.record_points((key,), got[1], got[:1])
    return got[0]


def softmax_grad_bound(p: torch.Tensor, pd: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """The bound of the softmax's input gradient dx = p * (dp - r), pd = p * dp, r = sum(pd): the native
    pass where it can (the same operations, the sum in another order), else these torch ops (the reference)."""
    fused = native.softmax_err(p, pd, dx, *SOFTMAX_GRAD)
    if fused is not None:
        return fused
    # zero terms add exactly, so m nonzero terms err by gamma(m - 1) (a causal row 0 sums one term: exact)
    m = (pd != 0).sum(-1, keepdim=True)
    c, k, u4 = SOFTMAX_GRAD
    err_r = pd.abs().sum(-1, keepdim=True) * ((m - 1).clamp(min=0) * c)
    # only r differs between machines; the sub and mul after it add rounding relative to the result
    return p * err_r * k + dx.abs() * u4


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dim; mean and variance are rounding points, the rest is IEEE arithmetic."""

    @staticmethod
    def forward(ctx, x, w, b, eps, name):
        R = active()
        op = R.op(name)
        key = op * SLOTS
        native_pass = _layer_norm_native(R, key, x, w, b, eps)
        y, xhat, rstd = native_pass or _LayerNorm.reference(R, key, x, w, b, eps)
        ctx.save_for_backward(xhat, rstd, w)
        ctx.op = op
        return y

    @staticmethod
    def reference(R, key, x, w, b, eps):
        """(y, xhat, rstd), each rounding point through the rounder."""
        n = x.shape[-1]
        inv_n = 1.0 / n
        mu = _mean(R, key, x, n, inv_n)
        d = x - mu
        var_raw = (d * d).sum(-1, keepdim=True) * inv_n
        var = R.full(key + 1, var_raw, lambda: var_raw * gamma(n + 1), var_raw.shape)
        s = sqrt_(var + eps)  # correctly rounded (torch's CPU kernel is not)
        rstd = torch.ones_like(s) / s
        xhat = d * rstd
        return xhat * w + b, xhat, rstd

    @staticmethod
    def backward(ctx, dy):
        R = active()
        xhat, rstd, w = ctx.saved_tensors
        key = ctx.op * SLOTS
        native_pass = _layer_norm_back_native(R, key, dy, xhat, rstd, w)
        dx, dw, db = native_pass or _LayerNorm.backward_reference(R, key, dy, xhat, rstd, w)
        return dx, dw, db, None, None

    @staticmethod
    def backward_reference(R, key, dy, xhat, rstd, w):
        """(dx, dw, db), each rounding point through the rounder."""
        n = xhat.shape[-1]
        inv_n = 1.0 / n
        rows_dy, rows_xh = dy.reshape(-1, n), xhat.reshape(-1, n)
        m = rows_dy.shape[0]
        dyx = rows_dy * rows_xh
        dw = R.full(key + 2, dyx.sum(0), lambda: abs_sum(dyx, 0) * gamma(m), (n,))
        db = R.full(key + 3, rows_dy.sum(0), lambda: abs_sum(rows_dy, 0) * gamma(m), (n,))
        g = dy * w
        gx = g * xhat
        a = _mean(R, key + 4, g, n, inv_n)
        c = _mean(R, key + 5, gx, n, inv_n)
        dx = (g - a - xhat * c) * rstd
        return dx, dw, db


def _layer_norm_native(R, key: int, x, w, b, eps: float):
    """_LayerNorm's forward in one native pass (the same operations, its sums in another order), where the
    rounder lets it (`Rounder.fused_mode`) and the kernel takes these tensors: (y, xhat, rstd), else None."""
    mode = R.fused_mode((key, key + 1))
    if mode is None:
        return None
    n, x = x.shape[-1], x.contiguous()
    if mode == "staged":  # each point through the rounder (a replay's log names one), between the kernel's stages
        return native.layer_norm_staged(x, w, b, eps, gamma(n + 1) / n, gamma(n + 1), _through(R, key))
    got = native.layer_norm(x, w, b, eps, gamma(n + 1) / n, gamma(n + 1), SAFETY, WIDE, mode == "record")
    if got is None:
        return None
    R.record_points((key, key + 1), got[3])
    return got[:3]


def _through(R, key: int):
    """A staged op's rounding point: slot's values with their bounds per element through the rounder."""
    return lambda slot, v, e: R.full(key + slot, v, e, v.shape)


def _layer_norm_back_native(R, key: int, dy, xhat, rstd, w):
    """_LayerNorm's backward in one native pass, as `_layer_norm_native`: (dx, dw, db), else None."""
    keys = (key + 2, key + 3, key + 4, key + 5)
    mode = R.fused_mode(keys)
    if mode is None:
        return None
    n, dy = xhat.shape[-1], dy.contiguous()
    rows = xhat.numel() // n if n else 0
    if mode == "staged":
        return native.layer_norm_back_staged(dy, xhat, rstd, w, gamma(n + 1) / n, gamma(rows), _through(R, key))
    got = native.layer_norm_back(dy, xhat, rstd, w, gamma(n + 1) / n, gamma(rows), SAFETY, WIDE, mode == "record")
    if got is None:
        return None
    R.record_points(keys, got[3])
    return got[:3]


class _Embedding(torch.autograd.Function):
    """W[idx]; the backward scatter-add is a rounding point."""

    @staticmethod
    def forward(ctx, idx, w, name):
        op = active().op(name)
        ctx.save_for_backward(idx)
        ctx.op, ctx.rows = op, w.shape[0]
        return w[idx]

    @staticmethod
    def backward(ctx, dy):
        (idx,) = ctx.saved_tensors
        flat, rows = idx.reshape(-1), dy.reshape(-1, dy.shape[-1])
        shape = (ctx.rows, rows.shape[1])
        # in place on fresh zeros (what index_add does out of place, the same sums): a vocabulary-sized
        # table is 300 MB in float64 at GPT-2 size, so no zero table is kept beside it, and the bound
        # (formed when recording, or where a replay's log names this point) costs one more, not two
        zeros = lambda: torch.zeros(shape, dtype=dy.dtype, device=dy.device)
        dw = zeros().index_add_(0, flat, rows)
        err = lambda: zeros().index_add_(0, flat, rows.abs()).mul_(gamma(flat.numel()))
        return None, active().full(ctx.op * SLOTS + 1, dw, err, dw.shape), None


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of logits (N, V) against targets (N,)."""

    @staticmethod
    def forward(ctx, logits, targets, name):
        R = active()
        op = R.op(name)
        n, v = logits.shape
        ctx.op, ctx.inv_n, ctx.v = op, 1.0 / n, v
        rounded = _cross_entropy_rounded(R, op * SLOTS, logits, targets)
        if rounded is not None:
            ctx.save_for_backward(rounded[1], targets)
            return rounded[0]
        fused = _cross_entropy_native(R, op * SLOTS, logits, targets)
        loss, err, p = fused if fused is not None else _CrossEntropy.reference(logits, targets)
        ctx.save_for_backward(p, targets)
        return R.full(op * SLOTS, loss, err, loss.shape, steers=False)  # the loss feeds no update

    @staticmethod
    def reference(logits, targets):
        """(the mean loss before rounding, its bound (a callable), the probabilities)."""
        n, v = logits.shape
        z = logits - logits.amax(-1, keepdim=True)
        zt = z.gather(1, targets.unsqueeze(1))
        e = z.exp_()  # in z's place (a logits-sized float64 fewer; the probabilities then take e's place)
        s = e.sum(-1, keepdim=True)
        ls = torch.log(s)
        row = ls - zt
        inv_n = 1.0 / n
        loss = row.sum() * inv_n

        def err():
            err_row = gamma(v + 8) + ls.abs() * EXP_ERR + row.abs() * U
            return (row.abs().sum() * gamma(n + 1) + err_row.sum()) * inv_n

        return loss, err, e.div_(s)

    @staticmethod
    def backward(ctx, gl):
        p, targets = ctx.saved_tensors
        fused = _cross_entropy_back_native(active(), ctx.op * SLOTS + 1, p, targets, gl, ctx.inv_n, ctx.v)
        if fused is not None:
            return fused, None, None
        c = gl * ctx.inv_n
        # logits-sized float64 tensors, the step's largest at a real vocabulary (the peak of a GPT-2
        # step): in place, and no one-hot. p - onehot is p + -1 at each row's target (x - y is x + -y)
        # and p elsewhere (p - 0 is p); the bound forms it again, only where it is needed (a replay
        # whose log names no entry here does not form it)
        t = targets.unsqueeze(1)
        minus_one = torch.full(t.shape, -1.0, dtype=p.dtype, device=p.device)
        p_minus_onehot = lambda: p.clone().scatter_add_(1, t, minus_one)
        dz = p_minus_onehot().mul_(c)

        def err():
            e = p_minus_onehot().abs_().mul_(U).add_(p * gamma(ctx.v + 10)).mul_(c.abs())
            return e.add_(dz.abs().mul_(2 * U))

        def pick(v, k):  # a device recording's search: err's operations per element in one kernel, dz rounded in place
            if not kernels.usable(v, p, targets):
                return None
            return kernels.pick_cross_entropy_back(v, p, targets, c, U, gamma(ctx.v + 10), SAFETY, k)

        # scale floor |c| (= |dL/dlogit| of a wrong prediction): see Bound.scale
        scale = c.abs().reshape(())
        return active().full(ctx.op * SLOTS + 1, dz, err, dz.shape, scale=scale, pick=pick), None, None


def _cross_entropy_native(R, key: int, logits, targets):
    """_CrossEntropy's forward through the kernel (torch's exp between its passes; the sums in another order)
    where the rounder forms its points as a pass would (`Rounder.fused_mode`: not under a tracer or a
    perturbation, which see the reference's operations): (loss, its bound, p), else None."""
    if not (logits.is_cpu and R.fused_mode((key,))):  # (a GPU's logits: no copy made for nothing)
        return None
    return native.cross_entropy(logits.contiguous(), targets, _cross_entropy_consts(logits))


def _cross_entropy_consts(logits) -> tuple:
    """`native.cross_entropy`'s consts for logits (N, V): gamma(V + 8), EXP_ERR, U, gamma(N + 1), 1 / N."""
    n, v = logits.shape
    return gamma(v + 8), EXP_ERR, U, gamma(n + 1), 1.0 / n


def _cross_entropy_rounded(R, key: int, logits, targets):
    """_CrossEntropy's forward with its loss's rounding point in the kernel's same pass (`native.cross_entropy`'s
    point: what `Rounder.full` does with the loss and its bound, without its ATen ops) where the rounder lets a pass
    round it (`Rounder.fused_mode`: a CPU recording, or a replay whose log names the loss not): (the rounded loss, p),
    its close call kept; else None (a replay whose log names it applies the log through `Rounder.full`)."""
    if not logits.is_cpu:
        return None
    mode = R.fused_mode((key,))
    if mode not in ("record", "plain"):
        return None
    point = (SAFETY, WIDE, mode == "record")
    got = native.cross_entropy(logits.contiguous(), targets, _cross_entropy_consts(logits), point)
    if got is None:
        return None
    loss, calls, p = got
    R.record_points((key,), [calls], (loss,))
    return loss, p


def _cross_entropy_back_native(R, key: int, p, targets, gl, inv_n: float, v: int):
    """_CrossEntropy's backward in one kernel pass (the reference's element-wise operations: the same bits),
    as `_softmax_back_native`: dz, else None. Its c = dL/dloss / rows as a Python float, float(gl) * inv_n: the IEEE
    multiply `gl * inv_n` makes, without its ATen op, and read only where the pass runs (on a CPU, the kernel's: the
    torch path, and a GPU's deferred one, make no host synchronisation for it)."""
    if not (p.is_cpu and gl.dim() == 0):
        return None
    run = lambda log: native.cross_entropy_back(p, targets, float(gl) * inv_n, (U, gamma(v + 10)), SAFETY, WIDE, log)
    return _one_point_pass(R, key, run)


class _Conv2d(torch.autograd.Function):
    """2-D convolution as unfold + matmul (never Winograd/FFT, whose errors the bound does not cover)."""

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, name):
        R = active()
        op = R.op(name)
        bsz, _, h, wd = x.shape
        o, _, kh, kw = w.shape
        x, w = _no_fold((x, w))
        if R.hands_norms():  # (B, C*kh*kw, L), exact copies; their norms where the kernel forms them too
            cols, nb = _unfold(x, (kh, kw), padding, stride, with_norms=True)
        else:
            cols, nb = _unfold(x, (kh, kw), padding, stride), None
        w2 = w.reshape(o, -1)
        # the bias added as a linear layer's is (`_Matmul`): on a CPU in the rounding point's pass, on a GPU inside the
        # GEMM; the same bound (its |bias| term covers a (K + 1)-term sum in any order)
        add = x.is_cpu
        y = (
            torch.bmm(w2.expand(bsz, -1, -1), cols)
            if add
            else torch.baddbmm(b.view(1, o, 1), w2.expand(bsz, -1, -1), cols)
        )
        ho = (h + 2 * padding - kh) // stride + 1
        wo = (wd + 2 * padding - kw) // stride + 1
        # the input, not its columns (kh*kw times its size at stride 1): backward unfolds it again, exact copies;
        # columns under PACK_MIN elements are kept as they are (their bytes do not matter, their copy's time does)
        ctx.kept_cols = cols.numel() < determinism.PACK_MIN
        # kept columns that are the step's own copy (not a view of x, which nothing else holds or changes) ride on ctx,
        # not among its saved tensors: backward lets go of them before the input gradient's columns and its rounding
        ctx.cols = cols if ctx.kept_cols and not cols._is_view() else None
        _save(ctx, None if ctx.cols is not None else cols if ctx.kept_cols else x, w2)
        ctx.op, ctx.geom = op, ((h, wd), (kh, kw), stride, padding, w.shape)
        return R.dot(op * SLOTS, y, w2, cols, bias=b, bias_rows=True, owned=True, norms=(None, nb), add=add).reshape(
            bsz, o, ho, wo
        )

    @staticmethod
    def backward(ctx, dy):
        R = active()
        kept, w2 = _saved(ctx)  # the columns, or the input to unfold again (None: the columns on ctx)
        if kept is None:
            if ctx.cols is None:
                raise RuntimeError("a det64 convolution lets go of its columns in backward: one backward per forward")
            kept, ctx.cols = ctx.cols, None
        kept, w2 = _no_fold((kept, w2))
        (h, wd), ksize, stride, padding, wshape = ctx.geom
        cols = kept if ctx.kept_cols else _unfold(kept, ksize, padding, stride)
        col_norms = None if ctx.kept_cols or R.mode != "record" else _channel_norms(kept, ksize)
        del kept
        key = ctx.op * SLOTS
        bsz, o = dy.shape[:2]
        g = dy.reshape(bsz, o, -1)  # (B, O, L)
        m = bsz * g.shape[2]
        # each image's product, then their sum: the order `_weight_grad_bound`'s gamma(B + L) is proven for (one
        # product over all B * L terms would need gamma(B * L): not to be folded into one mm)
        dw = torch.matmul(g, cols.transpose(1, 2)).sum(0)
        dw = R(key + 1, dw, _weight_grad_bound(g, cols, col_norms)).reshape(wshape)
        # kh*kw times the input: gone before its gradient's columns are made (kept ones too: they were on ctx, not among
        # its saved tensors, which live until backward returns; the bench's tiny cnn: a det64 step's resident peak
        # 4.96 -> 3.34 MiB, float32's 1.6)
        del cols
        db = _sums_native(R, key + 2, g)
        if db is None:
            db = R.full(key + 2, g.sum((0, 2)), lambda: g.abs().sum((0, 2)) * gamma(m), (o,))
        dx = None
        if ctx.needs_input_grad[0]:
            fold = lambda t: _fold(t, (h, wd), ksize, padding, stride)
            dx = fold(torch.matmul(w2.t(), g))  # the columns (B, CK, L) freed at once, before the rounding point
            fast = _conv_input_grad_native(R, key + 3, w2, g, fold, ksize, dx)
            if fast is not None:
                dx = fast
            else:
                dx = R.full(key + 3, dx, lambda: _conv_input_grad_bound(w2, g, fold, ksize, dx.shape), dx.shape)
        return dx, dw, db, None, None, None


def _unfold(x: torch.Tensor, ksize: tuple[int, int], padding: int, stride: int, with_norms: bool = False):
    """F.unfold(x, ksize, padding=padding, stride=stride), the same values: the padded input viewed as
    (B, C, kh, kw, Ho, Wo) windows and laid out in one copy (a view of x where the windows need none, a
    1 x 1 kernel: only ever read), where torch's im2col walks its windows element by element (two to
    four times slower on a CPU at a small network's sizes). On a CPU the native pass (`native.im2col`)
    makes that copy: no padded copy first, and rows that step (stride > 1) copied in vectors (cnn-32's
    first layer 0.76 -> 0.47 ms, its second's strided rows element by element otherwise). with_norms: (the
    columns, their norms (B * L,) where the native pass formed them, each image's while its columns are in cache,
    else None): what a recording's forward product reads of them, which its point would read from memory again
    (cnn-32's second layer's point 5.6 -> 2.9 ms)."""
    kh, kw = ksize
    if stride > 1 or padding or kh * kw > 1:  # a copy is made: the kernel's (a 1 x 1 window unpadded is a view)
        fast = native.im2col(x, ksize, padding, stride, with_norms=with_norms)
        if fast is not None:
            return fast
    if padding:
        x = F.pad(x, (padding,) * 4)
    bsz, c, h, w = x.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    sb, sc, sh, sw = x.stride()
    windows = x.as_strided((bsz, c, kh, kw, ho, wo), (sb, sc, sh, sw, sh * stride, sw * stride), x.storage_offset())
    cols = windows.reshape(bsz, c * kh * kw, ho * wo)
    return (cols, None) if with_norms else cols


def _fold(t: torch.Tensor, size, ksize, padding: int, stride: int) -> torch.Tensor:
    """F.fold(t, size, ksize, padding=padding, stride=stride): the native pass where it takes t (the same
    bits), else torch's."""
    fast = native.col2im(t, size, ksize, padding, stride)
    return fast if fast is not None else F.fold(t, size, ksize, padding=padding, stride=stride)


def _conv_input_grad_bound(w2, g, fold, ksize, shape) -> torch.Tensor:
    """Bound of dx = fold(W2^T @ g) for a convolution: per input element, an (O x <= kh*kw)-term sum.

    The computation is O-term dot products, then <= kh*kw-term overlap sums: its error is within
    gamma(O + kh*kw + 2) * sum |w||g| over those terms (gamma_a + gamma_b + gamma_a gamma_b <=
    gamma_(a+b)), and by Cauchy-Schwarz sum |w||g| <= ||W[:, c]|| * ||g over the window||. The
    window's squared norm is the fold of sum_o g^2, one channel: no full-size temporary.
    """
    window, nw, gm = _conv_input_grad_factors(w2, g, fold, ksize)
    # in place: one full-size temporary, not two (the same multiplications)
    return (window * nw.reshape(1, -1, 1, 1)).mul_(gm).expand(shape).contiguous()


def _conv_input_grad_factors(w2, g, fold, ksize):
    """`_conv_input_grad_bound`'s factors: (the window's norm (B, 1, H, W), the filter's per channel (C,), gamma)."""
    kk = ksize[0] * ksize[1]
    o = w2.shape[0]
    nw = (w2 * w2).reshape(o, -1, kk).sum((0, 2)).sqrt()  # (C,): ||W[:, c, :, :]||
    sq = (g * g).sum(1, keepdim=True)  # (B, 1, L)
    window = fold(sq.expand(-1, kk, -1)).sqrt()  # (B, 1, H, W)
    return window, nw, gamma(o + kk + 2)


def _conv_input_grad_native(R, key: int, w2, g, fold, ksize, dx):
    """The convolution's input gradient's point where the rounder lets the kernel take it: in one pass (`_one_point_pass`),
    its bound's outer product never formed when recording (`native.round_outer`: the same two multiplies per element),
    nor its factors in a plain replay; where a replay's log names it, through the rounder with the bound formed at
    the logged elements alone (`_outer_bound`). The rounded dx, else None."""
    if not (native.usable(dx) and dx.is_contiguous()):
        return None

    def run(log):
        if not log:
            return native.round_f32(dx), []
        window, nw, gm = _conv_input_grad_factors(w2, g, fold, ksize)
        return native.round_outer(dx, window, nw, gm, SAFETY, WIDE)

    stage = lambda: R(key, dx, _outer_bound(*_conv_input_grad_factors(w2, g, fold, ksize), dx.shape))
    return _one_point_pass(R, key, run, stage)


def _outer_bound(window, f, g: float, shape) -> Bound:
    """The bound (window[b, p] * f[c]) * g of an output (B, C, ...) with p its position, `_conv_input_grad_bound`'s
    two multiplies per element, as a Bound formed only at the elements asked for (a replay's logged ones)."""
    b, c = shape[:2]
    flat = window.reshape(b, -1)
    positions = flat.shape[1]

    def at(idx):
        return (flat[idx // (c * positions), idx % positions] * f[idx // positions % c]) * g

    return Bound(math.inf, at)


def _channel_norms(x: torch.Tensor, ksize: tuple[int, int]) -> torch.Tensor:
    """Bounds on the norms of unfold(x)'s rows (C * kh * kw,): each input channel's norm, kh * kw times. Each of a
    channel's kh * kw rows holds each of its pixels at most once (and padding zeros), so a row's norm is at most its
    channel's; read from the input, a ninth of the columns (3 x 3), where a recording's weight gradient needs them
    (`_weight_grad_bound`)."""
    per_image = torch.linalg.vector_norm(x.flatten(2), dim=-1)  # (B, C): along the last dim, with no temporary
    channels = (per_image * per_image).sum(0).sqrt_()
    # a NaN pixel: its channel's rows screened wide open (an infinite window flags, a NaN one would not), the exact
    # bounds then deciding, as with the rows' own norms (a row that never reads that pixel has a finite one)
    channels.masked_fill_(channels.isnan(), math.inf)
    return channels.repeat_interleave(ksize[0] * ksize[1])


def _weight_grad_gamma(images: int, positions: int) -> float:
    """`_weight_grad_bound`'s factor: the depth of its sum, not its length."""
    return gamma(images + positions)


def _weight_grad_bound(g: torch.Tensor, cols: torch.Tensor, col_norms=None) -> Bound:
    """Bound of sum_b g_b @ cols_b^T, g (B, O, L), cols (B, CK, L), as `_Conv2d.backward` forms it: each image's
    product (an L-term sum, in any order), then the B products' sum (in any order). No term passes through more than
    (L - 1) + (B - 1) additions and its own product, so gamma(L + B) bounds the error (Higham's gamma_n for a sum
    of depth n), where gamma(B * L) would be one reduction over all B * L terms: cnn-32's second layer's bound is 50
    times tighter, and its close calls as many times fewer. The kernel takes g and cols as they lie (a 2-D copy of
    cols would cost more than the product). col_norms: bounds on the norms of cols's rows (`_channel_norms`), or
    None: their own."""
    gm = _weight_grad_gamma(g.shape[0], g.shape[2])
    shape = (g.shape[1], cols.shape[1])
    memo = {}

    def parts():
        if not memo:
            memo["g"], memo["c"] = norms(g, (0, 2)), norms(cols, (0, 2)) if col_norms is None else col_norms
        return memo["g"], memo["c"]

    def cheap(idx):
        (o, k), (ng, nc) = unravel(idx, shape), parts()
        return ng[o] * nc[k] * gm

    def exact(idx):
        o, k = unravel(idx, shape)
        return (g[:, o, :].abs() * cols[:, k, :].abs()).sum((0, 2)) * gm

    def at(idx):  # a replay's logged elements: in the kernel where it takes them (the record pass's sums)
        fast = native.dot_summed_at(g.permute(1, 0, 2), cols.permute(0, 2, 1), gm, idx)
        return fast if fast is not None else in_chunks(exact, idx, g.shape[0] * g.shape[2])

    def coarse():  # (a NaN column's norm blanks no other column's window: `max_of_numbers`)
        ng, nc = parts()
        return (ng * (max_of_numbers(nc) * gm)).unsqueeze(-1)

    def fused(v):
        if not native.library():
            return None
        given = (None, col_norms) if col_norms is not None else None
        return native.round_dot_summed(v, g.permute(1, 0, 2), cols.permute(0, 2, 1), gm, SAFETY, WIDE, given)

    return Bound(math.inf, at, coarse=coarse, cheap=cheap, fused=fused)


def _causal(t: int, device) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool, device=device).triu(1)


class _Relu(torch.autograd.Function):
    """torch.relu with torch's own gradient (threshold_backward), whose output keeps float32 values where
    its input had them: noted, so the ops that save it (the next product) keep it as float32 too."""

    @staticmethod
    def forward(ctx, x):
        R = active()
        y = torch.relu(x)
        R.note_exact(y)  # `relu` sends here only an input of float32 values
        _save(ctx, y)
        return y

    @staticmethod
    def backward(ctx, g):
        (kept,) = ctx.saved_tensors
        if kept.dtype == torch.float32:  # its float32 copy read as it is, not widened first (one pass, not two)
            fast = native.relu_back(g, kept)
            if fast is not None:
                return fast
        (y,) = _saved(ctx)
        return torch.ops.aten.threshold_backward(g, y, 0)  # torch.relu's own backward


def _relu(x: torch.Tensor) -> torch.Tensor:
    """torch.relu; through `_Relu` where its output is worth keeping as float32 (large, float32 values)."""
    if PACK and x.numel() >= determinism.PACK_MIN and active().is_exact(x):
        return _Relu.apply(x)
    return torch.relu(x)


class Det:
    """Deterministic float64 ops (need `with determinism.rounding(r):`)."""

    dtype = torch.float64
    relu = staticmethod(_relu)

    @staticmethod
    def linear(x, w, b, name):
        # the weight as it is, and no reshapes of a 2-D input: each is a node of the graph (the 0.1M MLP's step -2.5%)
        if x.dim() == 2:
            return _Matmul.apply(x, w, b, 1.0, name, True)
        y = _Matmul.apply(x.reshape(-1, x.shape[-1]), w, b, 1.0, name, True)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def conv2d(x, w, b, stride, padding, name):
        return _Conv2d.apply(x, w, b, stride, padding, name)

    @staticmethod
    def layer_norm(x, w, b, name):
        return _LayerNorm.apply(x, w, b, 1e-5, name)

    @staticmethod
    def embedding(idx, w, name):
        return _Embedding.apply(idx, w, name)

    @staticmethod
    def attention(q, k, v, name):
        s = _Matmul.apply(q, k.transpose(-2, -1), None, 1.0 / math.sqrt(q.shape[-1]), name + ".qk")
        s = s.masked_fill(_causal(q.shape[-2], q.device), -math.inf)
        return _Matmul.apply(_Softmax.apply(s, name + ".softmax"), v, None, 1.0, name + ".pv")

    @staticmethod
    def cross_entropy(logits, targets, name):
        return _CrossEntropy.apply(logits, targets, name)


class Plain:
    """Ordinary float32 ops: the control."""

    dtype = torch.float32
    relu = staticmethod(torch.relu)

    @staticmethod
    def linear(x, w, b, name):
        return F.linear(x, w, b)

    @staticmethod
    def conv2d(x, w, b, stride, padding, name):
        return F.conv2d(x, w, b, stride=stride, padding=padding)

    @staticmethod
    def layer_norm(x, w, b, name):
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    @staticmethod
    def embedding(idx, w, name):
        return F.embedding(idx, w)

    @staticmethod
    def attention(q, k, v, name):
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        s = s.masked_fill(_causal(q.shape[-2], q.device), -math.inf)
        return torch.softmax(s, -1) @ v

    @staticmethod
    def cross_entropy(logits, targets, name):
        return F.cross_entropy(logits, targets)


class Plain64(Plain):
    """The same plain ops in float64: a baseline for benchmarks (`record --precision float64`), not
    deterministic across machines, so never a claimable precision."""

    dtype = torch.float64


OPS = {"det64": Det, "float32": Plain, "float64": Plain64}
