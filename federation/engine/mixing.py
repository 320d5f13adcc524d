"""Exchange as a row-stochastic mixing matrix and the transforms around it (ABPS paper Sec. 6.4): the
trunk / head split, the bf16 wire, server momentum, variance correction. Details: docs/runtime.md,
"Module notes".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

StackedParams = dict[str, torch.Tensor]

def wire(x: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The value a receiver sees: ``x`` rounded to bfloat16 (round-to-nearest-even) and back
    to fp32 when ``bf16``, else ``x``."""
    return x.to(torch.bfloat16).to(x.dtype) if bf16 else x


def check_row_stochastic(w: torch.Tensor, atol: float = 1e-6) -> None:
    """Raise ValueError unless ``w`` is ``[m, n]`` with finite, non-negative entries and rows
    summing to 1 (``atol``). A NaN or infinite entry is refused first: every comparison with NaN
    is false, so a 0/0 row would otherwise pass both other checks."""
    if w.dim() != 2:
        raise ValueError(f"mixing matrix must be 2-D, got shape {tuple(w.shape)}")
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        rows = int(bad.any(1).sum())
        raise ValueError(f"mixing matrix has non-finite entries (NaN or infinity) in {rows} row(s)")
    if bool((w < -atol).any()):
        raise ValueError("mixing matrix has negative entries")
    err = float((w.double().sum(1) - 1).abs().max()) if w.numel() else 0.0
    if err > atol:
        raise ValueError(f"mixing matrix rows must sum to 1 (max error {err:.2e})")


def sparse_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise non-zeros of ``w [m, n]`` (dense, or sparse COO) as ``(cols [m, K] int64,
    vals [m, K])`` with ``K`` the largest number of non-zeros in a row; shorter rows are padded
    with weight 0 (column of their first entry, or 0). Column order within a row is ascending."""
    m = w.shape[0]
    if w.is_sparse:
        w = w.coalesce()
        rr, cc = w.indices()
        nz = w.values() != 0
        rr, cc, v = rr[nz], cc[nz], w.values()[nz]
    else:
        rr, cc = torch.nonzero(w, as_tuple=True)
        v = w[rr, cc]
    counts = torch.bincount(rr, minlength=m)
    k = int(counts.max()) if m and rr.numel() else 1
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(rr.numel()) - start[rr]
    first = torch.zeros(m, dtype=torch.int64)
    first[counts > 0] = cc[start[counts > 0]]
    cols = first.unsqueeze(1).repeat(1, k)
    vals = torch.zeros(m, k, dtype=w.dtype)
    cols[rr, pos] = cc
    vals[rr, pos] = v
    return cols, vals


#: rows with at most n / SPARSE_RATIO non-zeros are mixed by gathering (see :func:`mix`)
SPARSE_RATIO = 8


def mix(w: torch.Tensor, theta: torch.Tensor, bf16: bool, own: torch.Tensor | None = None) -> torch.Tensor:
    """Mix one stacked tensor.

    Args:
        w: ``[m, n]`` row-stochastic weights.
        theta: ``[n, ...]`` stacked values of the n senders.
        bf16: apply the bf16 wire format to received values.
        own: ``[m]`` index of the receiving center of each row (its own copy stays fp32);
            default ``arange(n)`` (m = n, row i is center i).

    Returns:
        ``[m, ...]``: ``sum_j w[r, j] wire(theta_j) + w[r, own_r] (theta_own_r - wire(theta_own_r))``.

    Three equivalent evaluations (equal up to float summation order): identical rows (FedAvg's
    rank-one ``W``) mix once and broadcast; sparse rows (at most ``n / SPARSE_RATIO`` non-zeros,
    e.g. ABPS's ``kappa + 1``) are a weighted sum of gathered rows (``embedding_bag``), so the
    cost is ``m K P`` instead of ``m n P``; otherwise one dense product.
    """
    wf = w.to(theta.dtype)
    sent = wire(theta, bf16)
    m, n = wf.shape
    if m > 1 and bool((wf == wf[:1]).all()):
        out = torch.einsum("n,n...->...", wf[0], sent).expand(m, *theta.shape[1:]).clone()
    elif m and n >= SPARSE_RATIO and int((wf != 0).sum(1).max()) * SPARSE_RATIO <= n:
        cols, vals = sparse_rows(wf)
        flat = sent.reshape(n, -1)
        out = F.embedding_bag(cols, flat, per_sample_weights=vals, mode="sum").view(m, *theta.shape[1:])
    else:
        out = torch.einsum("mn,n...->m...", wf, sent)
    if bf16:
        own = torch.arange(theta.shape[0]) if own is None else own
        diag = wf.gather(1, own.unsqueeze(1)).squeeze(1)
        corr = (theta - sent)[own]
        out = out + diag.view((-1,) + (1,) * (theta.dim() - 1)) * corr
    return out


def mix_params(w: torch.Tensor, params: StackedParams, keys: tuple[str, ...], bf16: bool) -> StackedParams:
    """Mix the ``keys`` of stacked ``params`` with ``w [n, n]``; returns the new block only."""
    return {k: mix(w, params[k], bf16) for k in keys}


def apply_momentum(prev: StackedParams, mixed: StackedParams, state: StackedParams | None, beta: float) -> tuple[StackedParams, StackedParams]:
    """Server-side EMA momentum on the exchanged block (FedAvgM, Hsu et al. 2019, Alg. 1).

    With ``d_i = mixed_i - prev_i`` (``prev_i`` = center i's block at the start of the
    round, i.e. the previous aggregate), the update is

        m_i <- beta * m_i + (1 - beta) * d_i,     theta_i <- prev_i + m_i      (m_i = 0 at start)

    This is FedAvgM's ``v <- beta v + Delta; w <- w - eta v`` with pseudo-gradient
    ``Delta = prev - mixed`` and server learning rate ``eta = 1 - beta`` (substitute
    ``m = -eta v``). beta = 0 returns ``mixed`` exactly.

    Returns ``(new_block, new_state)``.
    """
    if state is None:
        state = {k: torch.zeros_like(v) for k, v in mixed.items()}
    new_state = {k: beta * state[k] + (1.0 - beta) * (mixed[k] - prev[k]) for k in mixed}
    return {k: prev[k] + new_state[k] for k in mixed}, new_state
