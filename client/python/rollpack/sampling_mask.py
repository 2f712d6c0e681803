"""Sampling-mask replay on the trainer's logits (docs/trainer.md,
"Sampling-mask log-probabilities"; the delivered field is docs/layout.md
section 13's ``sampling_mask``).

The engine sampled each generated token y_t from the softmax of its logits
restricted to the ids its top-k/top-p/min-p filter kept, S_t. Training on the
log-probability of y_t under that same restricted distribution removes the
sampler's share of the training-inference mismatch:

    logprob_t = z_t[y_t] - log sum_{u in S_t} exp(z_t[u])

``masked_token_logprobs`` computes it (and the restricted log-sum-exp) for
every row of a [T, V] logits tensor, differentiably: the backward is the
analytic one, dL/dz_t[v] = g_t (1[v = y_t] - p_t(v)) + h_t p_t(v) for v in
S_t and 0 outside, p_t the restricted softmax. The semantics are exactly
kernels/masked_logprob.h's:

- an empty list means "no mask": the full-vocabulary log-softmax (prompt
  and padding rows carry empty lists);
- a target the (non-empty) list does not hold gets logprob -inf and no
  gradient through it (its probability under the engine's distribution is
  0: a mismatch between the mask and the tokens to look into);
- the ids of a list must be distinct and in [0, V), targets in [0, V),
  offsets non-decreasing within values: otherwise ValueError naming the row.

Row t of ``logits`` predicts ``target_ids[t]``; its list must be the mask
the engine sampled ``target_ids[t]`` with, which the micro-batch delivers on
the row of that token. With next-token logits (row t predicts token t + 1)
and the micro-batch's ``offsets`` [T + 1], that is ``offsets[1:]`` for rows
0 .. T - 2: offsets need not start at 0, so the shift is a view, no copy.

Two implementations, the same results (tests/test_sampling_mask_logprobs.py holds
them to each other and to a per-row torch reference):

- "native": kernels/masked_logprob.h through librollpack_trainer.so
  (client/trainer/masked_logprob_capi.h, ctypes): the CUDA kernels on CUDA
  tensors, on the current stream, one warp per row, no host synchronisation
  and no check of the lists' contents (a row with an id or target outside
  [0, V) comes out NaN); the CPU reference (float64, every row checked) on
  CPU tensors. float32 and bfloat16 logits.
- "torch": gather, a segmented max and sum (scatter_reduce, index_add), a
  logsumexp over unmasked rows, on any device and for float64 too; it checks
  every list (one host synchronisation).

backend="auto" (the default) takes "native" for CUDA float32/bfloat16
logits when the library has the kernels, else "torch".
"""

from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import torch

_ID_DTYPES = (torch.int16, torch.int32, torch.int64)  # int16: the wire's uint16 ids
_FLOAT = {torch.float32: 0, torch.bfloat16: 1}
_INDEX = {torch.int16: 1, torch.int32: 2, torch.int64: 3}  # kernels::IndexType; int16 = uint16
_BACKENDS = ("auto", "native", "torch")
_native_lib = None  # None: not looked for yet; False: unavailable


def _native() -> Optional[ctypes.CDLL]:
    """librollpack_trainer.so when it has the masked-logprob kernels, else None."""
    global _native_lib
    if _native_lib is None:
        try:
            from rollpack import _capi
            _native_lib = _bind(_capi._lib())
        except (ImportError, OSError, AttributeError):
            _native_lib = False
    return _native_lib or None


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """lib with the rpt_masked_logprob_* signatures of
    client/trainer/masked_logprob_capi.h set (AttributeError if it has none)."""
    fwd, bwd = lib.rpt_masked_logprob_forward, lib.rpt_masked_logprob_backward
    p, i, l = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    head = [i, p, i, l, l, p, i, l, p, i, p, i]
    fwd.argtypes = head + [p, p, p]
    bwd.argtypes = head + [p, p, p, p, p]
    fwd.restype = bwd.restype = i
    lib.rpt_masked_logprob_last_error.restype = ctypes.c_char_p
    return lib


def _native_call(fn, *args) -> None:
    rc = fn(*args)
    if rc != 0:
        msg = "masked_token_logprobs: %s" % _native().rpt_masked_logprob_last_error().decode(
            errors="replace")
        raise ValueError(msg) if rc == 3 else RuntimeError(msg)  # 3 = INVALID_ARGUMENT


def _ids(values: torch.Tensor) -> torch.Tensor:
    ids = values.to(torch.int64)
    if values.dtype == torch.int16:  # uint16 ids arrive as int16 (no torch.uint16 here)
        ids = ids & 0xFFFF
    return ids


def _check(cond: torch.Tensor, what: str, rows: torch.Tensor) -> None:
    """Raises ValueError naming the first row where cond is False."""
    bad = ~cond
    if bool(bad.any()):
        r = int(rows[bad.nonzero()[0, 0]]) if rows.numel() else -1
        raise ValueError("masked_token_logprobs: %s at row %d" % (what, r))


class _MaskedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, row, targets, dense_rows):
        t, v = logits.shape
        comp = torch.float64 if logits.dtype == torch.float64 else torch.float32
        z = logits[row, ids].to(comp)
        m = torch.full((t,), float("-inf"), dtype=comp, device=logits.device)
        m = m.scatter_reduce(0, row, z, reduce="amax", include_self=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        s = torch.zeros((t,), dtype=comp, device=logits.device)
        s.index_add_(0, row, torch.exp(z - m[row]))
        lse = m + torch.log(s)
        if dense_rows.numel():
            lse[dense_rows] = torch.logsumexp(logits[dense_rows].to(comp), dim=1)
        kept = torch.zeros((t,), dtype=torch.bool, device=logits.device)
        kept[row[ids == targets[row]]] = True
        kept[dense_rows] = True
        zt = logits.gather(1, targets.unsqueeze(1)).squeeze(1).to(comp)
        logprobs = torch.where(kept, zt - lse, torch.full_like(lse, float("-inf")))
        ctx.save_for_backward(logits, ids, row, targets, dense_rows, lse, kept)
        return logprobs, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, grad_lse):
        logits, ids, row, targets, dense_rows, lse, kept = ctx.saved_tensors
        t, v = logits.shape
        comp = lse.dtype
        g = torch.where(kept, grad_logprobs.to(comp), torch.zeros_like(lse))
        c = grad_lse.to(comp) - g  # the coefficient of p_t(v)
        grad = torch.zeros((t, v), dtype=comp, device=logits.device)
        p = torch.exp(logits[row, ids].to(comp) - lse[row])
        grad[row, ids] = c[row] * p
        if dense_rows.numel():
            grad[dense_rows] = c[dense_rows].unsqueeze(1) * torch.exp(
                logits[dense_rows].to(comp) - lse[dense_rows].unsqueeze(1))
        grad[torch.arange(t, device=logits.device), targets] += g
        return grad.to(logits.dtype), None, None, None, None


class _NativeMaskedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, values, offsets, targets):
        t, v = logits.shape
        lp = torch.empty((t,), dtype=torch.float32, device=logits.device)
        lse = torch.empty((t,), dtype=torch.float32, device=logits.device)
        lib = _native()
        _native_call(lib.rpt_masked_logprob_forward, *_native_head(logits, values, offsets,
                                                                   targets),
                     lp.data_ptr(), lse.data_ptr(), _stream(logits))
        ctx.save_for_backward(logits, values, offsets, targets, lse)
        return lp, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprobs, grad_lse):
        logits, values, offsets, targets, lse = ctx.saved_tensors
        g = grad_logprobs.to(torch.float32).contiguous()
        h = grad_lse.to(torch.float32).contiguous()
        grad = torch.empty_like(logits)
        lib = _native()
        _native_call(lib.rpt_masked_logprob_backward, *_native_head(logits, values, offsets,
                                                                    targets),
                     lse.data_ptr(), g.data_ptr(), h.data_ptr(), grad.data_ptr(), _stream(logits))
        return grad, None, None, None


def _native_head(logits, values, offsets, targets):
    """The arguments every rpt_masked_logprob_* call starts with."""
    t, v = logits.shape
    device = logits.device.index if logits.is_cuda else -1
    return (device, logits.data_ptr(), _FLOAT[logits.dtype], t, v, values.data_ptr(),
            _INDEX[values.dtype], values.numel(), offsets.data_ptr(), _INDEX[offsets.dtype],
            targets.data_ptr(), _INDEX[targets.dtype])


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def masked_token_logprobs(logits: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor,
                          target_ids: torch.Tensor, *, return_lse: bool = False,
                          backend: str = "auto"
                          ) -> torch.Tensor | Tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of target_ids[t] under the softmax of logits[t]
    restricted to values[offsets[t]:offsets[t+1]] (all of [0, V) when that
    list is empty).

    logits: [T, V] float32, bfloat16 (computed in float32) or float64;
    values: 1-D kept ids (int16 = uint16 ids, int32, int64); offsets: [T + 1]
    int32 / int64, non-decreasing, within values (offsets[0] may be > 0);
    target_ids: [T] int32 / int64. Returns logprobs [T] (float64 for float64
    logits, else float32), differentiable w.r.t. logits, and with
    return_lse=True also the restricted log-sum-exp [T] (differentiable too).
    backend: "auto", "native" or "torch" (the module's docstring).
    """
    if backend not in _BACKENDS:
        raise ValueError("masked_token_logprobs: backend must be one of %s, got %r"
                         % (", ".join(_BACKENDS), backend))
    if logits.dim() != 2:
        raise ValueError("masked_token_logprobs: logits must be [T, V], got %s"
                         % (tuple(logits.shape),))
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float64):
        raise TypeError("masked_token_logprobs: logits must be float32, bfloat16 or float64, "
                        "got %s" % logits.dtype)
    t, v = logits.shape
    for name, x in (("values", values), ("offsets", offsets), ("target_ids", target_ids)):
        if x.device != logits.device:
            raise ValueError("masked_token_logprobs: %s is on %s, logits on %s"
                             % (name, x.device, logits.device))
        if x.dim() != 1 or x.dtype not in _ID_DTYPES:
            raise ValueError("masked_token_logprobs: %s must be a 1-D integer tensor, got %s %s"
                             % (name, x.dtype, tuple(x.shape)))
    if offsets.numel() != t + 1 or target_ids.numel() != t:
        raise ValueError("masked_token_logprobs: %d logits rows need offsets [%d] and "
                         "target_ids [%d], got [%d] and [%d]"
                         % (t, t + 1, t, offsets.numel(), target_ids.numel()))
    native = backend == "native" or (backend == "auto" and logits.is_cuda and
                                      logits.dtype in _FLOAT and _native() is not None)
    if native:
        if _native() is None:
            raise RuntimeError("masked_token_logprobs: backend 'native' needs "
                               "librollpack_trainer.so with rpt_masked_logprob_forward "
                               "(build the target rollpack_trainer)")
        if logits.dtype not in _FLOAT:
            raise TypeError("masked_token_logprobs: backend 'native' takes float32 or bfloat16 "
                            "logits, got %s" % logits.dtype)
        # Offsets and targets as int32/int64 (the kernel's); the rest as they come.
        offsets = offsets if offsets.dtype != torch.int16 else offsets.to(torch.int32)
        target_ids = target_ids if target_ids.dtype != torch.int16 else target_ids.to(torch.int32)
        logprobs, lse = _NativeMaskedTokenLogprobs.apply(
            logits.contiguous(), values.contiguous(), offsets.contiguous(),
            target_ids.contiguous())
        return (logprobs, lse) if return_lse else logprobs
    off = offsets.to(torch.int64)
    counts = off[1:] - off[:-1]
    every_row = torch.arange(t, device=logits.device)
    _check(counts >= 0, "offsets decrease", every_row)
    lo, hi = (int(x) for x in off[[0, -1]].tolist()) if t else (0, 0)
    if lo < 0 or hi > values.numel():
        raise ValueError("masked_token_logprobs: offsets span [%d, %d), outside the %d values"
                         % (lo, hi, values.numel()))
    targets = target_ids.to(torch.int64)
    _check((targets >= 0) & (targets < v), "target outside [0, V = %d)" % v, every_row)
    ids = _ids(values[lo:hi])
    row = torch.repeat_interleave(every_row, counts)
    _check((ids >= 0) & (ids < v), "kept id outside [0, V = %d)" % v, row)
    if ids.numel():
        key, n = torch.unique(row * v + ids, return_counts=True)
        if bool((n > 1).any()):
            r = int(key[(n > 1).nonzero()[0, 0]]) // v
            raise ValueError("masked_token_logprobs: a kept id repeated at row %d" % r)
    dense_rows = (counts == 0).nonzero().squeeze(1)
    logprobs, lse = _MaskedTokenLogprobs.apply(logits, ids, row, targets, dense_rows)
    return (logprobs, lse) if return_lse else logprobs
