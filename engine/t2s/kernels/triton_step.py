"""Triton kernels for the T2S decode step (CUDA; also runnable under ``TRITON_INTERPRET=1``).

At batch 1 a decode step is a chain of tiny launches; these kernels cut their number and make
each one use many multiprocessors:

* :func:`decode_attention`: attend one query over the valid cache positions, split over the
  cache length (partial softmax per split, then one combine that also adds the new position
  from registers and writes its key/value into the cache): two launches instead of about ten.
* :func:`gemv`: ``y = act(W @ LN(x + r) + b)`` for a few rows (decode batches), with the
  residual add and LayerNorm of the *previous* sub-layer fused into its prologue (it also
  writes the normalised rows for the residual path) and bias/ReLU in its epilogue.
* :func:`add_layer_norm`: ``LayerNorm(x + r)`` alone (the last block's output).

Any width works: ``tl.arange`` needs a power of two, so each kernel pads the head width, the model width
and the FFN width to the next one and masks the padded lanes (they load zeros and store nothing). The
limits on tile size are checked once per model by :func:`engine.t2s.kernels.choose_attention`.

Import this module only where Triton is available (it imports triton at import time).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPLIT = 128  # cache positions per attention program
MAX_GEMV_ROWS = 8  # larger decode batches go through cuBLAS


@triton.jit
def _attention_split_kernel(
    qkv_ptr, k_cache_ptr, v_cache_ptr, valid_ptr, pos_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr,  # (B, H, S), (B, H, S), (B, H, S, HD) float32
    D, scale,
    CAP: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr, SPLIT_N: tl.constexpr,
    N_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, HDP)  # the head width padded to a power of two; lanes d >= HD are masked off
    d_ok = d < HD
    q = tl.load(qkv_ptr + b * 3 * D + h * HD + d, mask=d_ok, other=0.0).to(tl.float32)
    n = s * SPLIT_N + tl.arange(0, SPLIT_N)
    ok = (tl.load(valid_ptr + b * CAP + n, mask=n < CAP, other=0) != 0) & (n != pos) & (n < CAP)
    kv_off = (b * H + h) * CAP * HD + n[:, None] * HD + d[None, :]
    kv_ok = ok[:, None] & d_ok[None, :]
    k = tl.load(k_cache_ptr + kv_off, mask=kv_ok, other=0.0).to(tl.float32)
    scores = tl.where(ok, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
    m = tl.max(scores, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(scores - m_safe)
    v = tl.load(v_cache_ptr + kv_off, mask=kv_ok, other=0.0).to(tl.float32)
    acc = tl.sum(p[:, None] * v, axis=0)
    idx = (b * H + h) * N_SPLITS + s
    tl.store(part_m_ptr + idx, m)
    tl.store(part_l_ptr + idx, tl.sum(p, axis=0))
    tl.store(part_acc_ptr + idx * HD + d, acc, mask=d_ok)


@triton.jit
def _attention_combine_kernel(
    qkv_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    D, scale,
    CAP: tl.constexpr, H: tl.constexpr, HD: tl.constexpr, HDP: tl.constexpr, N_SPLITS: tl.constexpr,
    SP: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr)
    d = tl.arange(0, HDP)
    d_ok = d < HD
    row = qkv_ptr + b * 3 * D + h * HD
    q = tl.load(row + d, mask=d_ok, other=0.0).to(tl.float32)
    k_new = tl.load(row + D + d, mask=d_ok, other=0.0)
    v_new = tl.load(row + 2 * D + d, mask=d_ok, other=0.0)
    # the new position from registers, then the splits' partial softmaxes
    m_new = tl.sum(q * k_new.to(tl.float32), axis=0) * scale
    sp = tl.arange(0, SP)
    base = (b * H + h) * N_SPLITS
    pm = tl.load(part_m_ptr + base + sp, mask=sp < N_SPLITS, other=float("-inf"))
    pl = tl.load(part_l_ptr + base + sp, mask=sp < N_SPLITS, other=0.0)
    pacc = tl.load(part_acc_ptr + (base + sp[:, None]) * HD + d[None, :],
                   mask=(sp < N_SPLITS)[:, None] & d_ok[None, :], other=0.0)
    m = tl.maximum(m_new, tl.max(pm, axis=0))
    w = tl.where(pm == float("-inf"), 0.0, tl.exp(pm - m))
    w_new = tl.exp(m_new - m)
    l_total = w_new + tl.sum(w * pl, axis=0)
    acc = w_new * v_new.to(tl.float32) + tl.sum(w[:, None] * pacc, axis=0)
    tl.store(out_ptr + b * D + h * HD + d, (acc / l_total).to(out_ptr.dtype.element_ty), mask=d_ok)
    head = (b * H + h) * CAP * HD + pos * HD + d
    tl.store(k_cache_ptr + head, k_new, mask=d_ok)
    tl.store(v_cache_ptr + head, v_new, mask=d_ok)


def decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, valid: torch.Tensor,
                     pos: torch.Tensor) -> torch.Tensor:
    """qkv (B, 3D) of one new position; caches (B, H, CAP, HD) get it at ``pos``; valid (B, CAP). -> (B, D)."""
    b, three_d = qkv.shape
    _, h, cap, hd = k_cache.shape
    d = three_d // 3
    n_splits = triton.cdiv(cap, SPLIT)
    part_m = torch.empty(b, h, n_splits, device=qkv.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(b, h, n_splits, hd, device=qkv.device, dtype=torch.float32)
    scale = hd ** -0.5
    hdp = triton.next_power_of_2(hd)
    _attention_split_kernel[(b, h, n_splits)](qkv, k_cache, v_cache, valid, pos, part_m, part_l, part_acc,
                                              d, scale, CAP=cap, H=h, HD=hd, HDP=hdp, SPLIT_N=SPLIT,
                                              N_SPLITS=n_splits)
    out = torch.empty(b, d, device=qkv.device, dtype=qkv.dtype)
    _attention_combine_kernel[(b, h)](qkv, k_cache, v_cache, pos, part_m, part_l, part_acc, out, d, scale,
                                      CAP=cap, H=h, HD=hd, HDP=hdp, N_SPLITS=n_splits,
                                      SP=max(2, triton.next_power_of_2(n_splits)))
    return out


@triton.jit
def _gemv_kernel(
    x_ptr, r_ptr, ln_w_ptr, ln_b_ptr, x_out_ptr, w_ptr, bias_ptr, y_ptr,
    N, eps,
    ROWS: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LN: tl.constexpr, HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, KP)
    n_ok = n < N
    k_ok = k < K
    w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)
    for row in range(ROWS):
        xv = tl.load(x_ptr + row * K + k, mask=k_ok, other=0.0).to(tl.float32)
        if HAS_LN:
            xv += tl.load(r_ptr + row * K + k, mask=k_ok, other=0.0).to(tl.float32)
            mean = tl.sum(xv, axis=0) / K
            xc = tl.where(k_ok, xv - mean, 0.0)
            var = tl.sum(xc * xc, axis=0) / K
            xv = xc / tl.sqrt(var + eps) * tl.load(ln_w_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            xv += tl.load(ln_b_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
            if pid == 0:
                tl.store(x_out_ptr + row * K + k, xv.to(x_out_ptr.dtype.element_ty), mask=k_ok)
            xv = xv.to(x_out_ptr.dtype.element_ty).to(tl.float32)  # the residual path sees the stored value
        y = tl.sum(w * xv[None, :], axis=1)
        if HAS_BIAS:
            y += bias
        if RELU:
            y = tl.maximum(y, 0.0)
        tl.store(y_ptr + row * N + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, relu: bool = False,
         residual: torch.Tensor | None = None, norm: torch.nn.LayerNorm | None = None
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, x_used) with x_used = norm(x + residual) when a norm is given (else x), y = act(W x_used + b).

    x (R, K) with R <= MAX_GEMV_ROWS rows; weight (N, K) as nn.Linear stores it.
    """
    rows, k = x.shape
    n = weight.shape[0]
    kp = triton.next_power_of_2(k)
    block_n = max(2, min(64, 8192 // kp))
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    x_used = torch.empty_like(x) if norm is not None else x
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, residual if residual is not None else x, norm.weight if norm is not None else weight,
        norm.bias if norm is not None else weight, x_used, weight, bias if bias is not None else weight, y,
        n, norm.eps if norm is not None else 0.0,
        ROWS=rows, K=k, KP=kp, BLOCK_N=block_n, HAS_LN=norm is not None, HAS_BIAS=bias is not None, RELU=relu,
        num_warps=4,
    )
    return y, x_used


@triton.jit
def _add_layer_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(r_ptr + row * D + cols, mask=m, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    xc = tl.where(m, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / D
    y = xc / tl.sqrt(var + eps) * tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y += tl.load(b_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """``norm(x + r)`` over the last axis in one launch (statistics in float32)."""
    d = x.shape[-1]
    x2, r2 = x.reshape(-1, d), r.reshape(-1, d)
    out = torch.empty_like(x2)
    _add_layer_norm_kernel[(x2.shape[0],)](x2, r2, norm.weight, norm.bias, out, d, norm.eps,
                                           BLOCK=triton.next_power_of_2(d))
    return out.view_as(x)
