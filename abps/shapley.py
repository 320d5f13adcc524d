"""Shapley credit of each partner and the affine clip (ABPS paper Sec. 4.2, eqs. 4-5; Sec. 6.3).

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from abps.matching import center_weights

__all__ = [
    "shapley_matrix",
    "exact_shapley",
    "clip_phi",
    "CoalitionPlan",
    "ShapleyResult",
    "build_coalitions",
    "shapley_from_utilities",
]


def _bits(m: int) -> Tensor:
    """``[2^m, m]`` float64: bit ``k`` of each bitmask (player ``k`` in coalition)."""
    masks = torch.arange(2**m, dtype=torch.long)
    return ((masks[:, None] >> torch.arange(m, dtype=torch.long)[None, :]) & 1).to(torch.float64)


def shapley_matrix(m: int) -> Tensor:
    """Linear map from coalition utilities to exact Shapley values (eq. 4).

    ``M[mask, k] = w(|mask| - 1)`` if player ``k`` is in ``mask``, else ``-w(|mask|)``, with
    ``w(s) = s! (m - s - 1)! / m!``. Then ``phi = u @ M`` for utilities ``u`` ``[..., 2^m]`` indexed
    by bitmask (bit ``k`` = player ``k``).

    Returns:
        ``[2^m, m]`` float64.
    Raises:
        ValueError: ``m < 1`` or ``m > 20``.
    """
    if not 1 <= m <= 20:
        raise ValueError(f"exact Shapley needs 1 <= m <= 20 players, got {m}")
    bits = _bits(m)
    size = bits.sum(dim=1).to(torch.long)
    w = torch.tensor(
        [math.factorial(s) * math.factorial(m - s - 1) / math.factorial(m) for s in range(m)], dtype=torch.float64
    )
    w_in = w[(size - 1).clamp(min=0)]  # used where the player is in the mask (size >= 1)
    w_out = w[size.clamp(max=m - 1)]  # used where the player is absent (size <= m - 1)
    return torch.where(bits > 0, w_in[:, None], -w_out[:, None])


def exact_shapley(utilities: Tensor) -> Tensor:
    """Exact Shapley values (eq. 4) from a full table of coalition utilities.

    Args:
        utilities: ``[..., 2^m]``, ``utilities[..., mask]`` = ``U(S)`` for the coalition with bitmask ``mask``.
    Returns:
        ``[..., m]`` float64; satisfies efficiency ``sum_k phi_k = U(all) - U(empty)`` (eq. 19).
    Raises:
        ValueError: last dimension not a power of two >= 2.
    """
    size = utilities.shape[-1]
    m = size.bit_length() - 1
    if size < 2 or 2**m != size:
        raise ValueError(f"utility table must have 2^m >= 2 entries, got {size}")
    return utilities.to(torch.float64) @ shapley_matrix(m)


def clip_phi(phi: Tensor, phi_min: float = -0.1, phi_max: float = 0.1) -> Tensor:
    """Affine clip of eq. (5): ``clip((phi - phi_min) / (phi_max - phi_min), 0, 1)``; NaN stays NaN.

    Raises:
        ValueError: ``phi_max <= phi_min``.
    """
    if not phi_max > phi_min:
        raise ValueError(f"need phi_max > phi_min, got ({phi_min}, {phi_max})")
    return ((phi.to(torch.float64) - phi_min) / (phi_max - phi_min)).clamp(0.0, 1.0)


@dataclass
class _ExactGroup:
    centers: Tensor  # [c] long
    partners: Tensor  # [c, m] long, sorted ascending
    row0: int  # first row of this group; center r's coalitions are rows row0 + r * 2^m + mask


@dataclass
class _TmcGroup:
    centers: Tensor  # [c] long
    partners: Tensor  # [c, m] long
    perms: Tensor  # [c, B, m] long, indices into partners
    row0: int  # per center 2 + B (m - 1) rows: empty, full, then prefixes (b, L = 1..m-1)


@dataclass
class CoalitionPlan:
    """Every coalition of every center as one batched evaluation request.

    Attributes:
        cols: ``[R, M]`` int64 members of each row's coalition ``{i} U S`` (target first; padded
            with the target at weight 0).
        vals: ``[R, M]`` float64 their FedAvg weights (the exchange's, renormalized over the
            coalition; rows sum to 1).
        targets: ``[R]`` int64, the center ``i`` whose head and validation split row ``r`` uses.
        partners: ``[n, n]`` bool partner graph the plan was built from.
        truncation_tol: TMC truncation tolerance (AUROC units).
    """

    cols: Tensor
    vals: Tensor
    targets: Tensor
    partners: Tensor
    truncation_tol: float = 0.0
    exact_groups: list[_ExactGroup] = field(default_factory=list)
    tmc_groups: list[_TmcGroup] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        """Number of coalition rows ``R``."""
        return int(self.targets.numel())

    @property
    def mixing(self) -> Tensor:
        """``[R, n]`` float64 dense row-stochastic mixing rows (built on access; ``O(R n)`` memory)."""
        n = self.partners.shape[0]
        out = torch.zeros(self.num_rows, n, dtype=torch.float64)
        return out.scatter_add_(1, self.cols, self.vals)

    @property
    def mixing_sparse(self) -> Tensor:
        """The mixing rows as a coalesced sparse COO ``[R, n]`` float64 tensor (``O(R M)`` memory)."""
        n = self.partners.shape[0]
        keep = self.vals > 0
        rows = torch.arange(self.num_rows).unsqueeze(1).expand_as(self.cols)[keep]
        idx = torch.stack([rows, self.cols[keep]])
        return torch.sparse_coo_tensor(idx, self.vals[keep], (self.num_rows, n), check_invariants=False).coalesce()


@dataclass
class ShapleyResult:
    """Shapley credit of one round.

    Attributes:
        phi: ``[n, n]`` float64, ``phi[i, j] = phi_{j->i}``; NaN where ``j`` is not in ``P_i`` or the
            utilities of ``i`` were not finite (one-class validation split).
        observed: ``[n, n]`` bool, where ``phi`` is finite.
        u_local: ``[n]`` ``U_i(empty)``: validation AUROC of ``i``'s own model (NaN for resting centers).
        u_full: ``[n]`` ``U_i(P_i)``: validation AUROC after the exchange (NaN for resting centers).
    """

    phi: Tensor
    observed: Tensor
    u_local: Tensor
    u_full: Tensor


def _member_rows(centers: Tensor, partners: Tensor, bits: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Sparse mixing rows ``(cols, vals)``, each ``[c, K, m + 1]``, for coalitions
    ``{center} U {partners[k] : bits[c?, K, k] = 1}``: column 0 is the center, column ``1 + k``
    partner ``k`` (weight 0 when absent); weights renormalized over the coalition."""
    c, m = partners.shape
    k_rows = bits.shape[-2]
    cols = torch.cat([centers[:, None], partners], dim=1)[:, None, :].expand(c, k_rows, m + 1)
    incl = torch.cat([torch.ones(c, k_rows, 1, dtype=torch.float64),
                      bits.to(torch.float64).expand(c, k_rows, m)], dim=2)
    vals = incl * weights[cols]
    return cols, vals / vals.sum(dim=2, keepdim=True)


def build_coalitions(
    partners: Tensor,
    weights: Tensor | None = None,
    exact_max: int = 5,
    num_permutations: int = 8,
    truncation_tol: float = 0.0,
    rng: np.random.Generator | None = None,
) -> CoalitionPlan:
    """Lay out the coalitions needed for every center's Shapley credit (eq. 4) as mixing rows.

    Centers are grouped by ``m = |P_i|`` and each group is built as one tensor operation (no loop over
    centers). Resting centers (``m = 0``) contribute no rows.

    Args:
        partners: ``[n, n]`` bool symmetric partner graph.
        weights: ``[n]`` positive FedAvg weights (training-set sizes) or None for uniform; must match
            the weights of the exchange so that the full coalition's row equals ``W[i]``.
        exact_max: largest ``m`` computed exactly (paper: 5).
        num_permutations: ``B`` for TMC when ``m > exact_max`` (paper: 8).
        truncation_tol: TMC truncation tolerance in AUROC units (0 disables truncation).
        rng: generator for the TMC permutations (required only when some ``m > exact_max``).
    Returns:
        :class:`CoalitionPlan` with ``R = sum_{m_i <= exact_max, m_i > 0} 2^{m_i}
        + sum_{m_i > exact_max} (2 + B (m_i - 1))`` rows.
    Raises:
        ValueError: bad shapes, non-positive weights, ``exact_max`` outside [1, 20], ``B < 1``, or TMC
            needed without ``rng``.
    """
    n = partners.shape[0]
    p = partners.to(torch.bool).clone()
    p.fill_diagonal_(False)
    w = center_weights(weights, n)
    if not 1 <= exact_max <= 20:
        raise ValueError(f"exact_max must be in [1, 20], got {exact_max}")
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}")
    deg = p.sum(dim=1)
    blocks_w: list[tuple[Tensor, Tensor]] = []
    blocks_t: list[Tensor] = []
    exact_groups: list[_ExactGroup] = []
    tmc_groups: list[_TmcGroup] = []
    row = 0
    for m in sorted(int(v) for v in torch.unique(deg) if int(v) > 0):
        cs = torch.nonzero(deg == m).flatten()
        # partner lists, ascending center id: the m True columns of each row
        plist = torch.nonzero(p[cs]).reshape(cs.numel(), m, 2)[:, :, 1]
        c = cs.numel()
        if m <= exact_max:
            cols, vals = _member_rows(cs, plist, _bits(m)[None], w)  # [c, 2^m, m + 1]
            exact_groups.append(_ExactGroup(cs, plist, row))
            blocks_w.append((cols.reshape(c * 2**m, m + 1), vals.reshape(c * 2**m, m + 1)))
            blocks_t.append(cs.repeat_interleave(2**m))
            row += c * 2**m
        else:
            if rng is None:
                raise ValueError("an rng is required for truncated Monte Carlo Shapley (|P_i| > exact_max)")
            b = num_permutations
            perms = torch.from_numpy(np.argsort(rng.random((c, b, m)), axis=2)).to(torch.long)  # [c, B, m]
            rank = torch.argsort(perms, dim=2)  # position of partner k in permutation b
            lengths = torch.arange(1, m, dtype=torch.long)  # prefix lengths 1..m-1
            pref = (rank[:, :, None, :] < lengths[None, None, :, None]).to(torch.float64)  # [c, B, m-1, m]
            ends = torch.stack([torch.zeros(m, dtype=torch.float64), torch.ones(m, dtype=torch.float64)])  # empty, full
            bits = torch.cat([ends[None].expand(c, 2, m), pref.reshape(c, b * (m - 1), m)], dim=1)
            cols, vals = _member_rows(cs, plist, bits, w)  # [c, 2 + B (m-1), m + 1]
            k_rows = 2 + b * (m - 1)
            tmc_groups.append(_TmcGroup(cs, plist, perms, row))
            blocks_w.append((cols.reshape(c * k_rows, m + 1), vals.reshape(c * k_rows, m + 1)))
            blocks_t.append(cs.repeat_interleave(k_rows))
            row += c * k_rows
    width = max((cw.shape[1] for cw, _ in blocks_w), default=1)
    targets = torch.cat(blocks_t) if blocks_t else torch.zeros(0, dtype=torch.long)
    cols = targets[:, None].repeat(1, width)  # padding: the target at weight 0
    vals = torch.zeros(targets.numel(), width, dtype=torch.float64)
    lo = 0
    for cw, vw in blocks_w:
        cols[lo : lo + cw.shape[0], : cw.shape[1]] = cw
        vals[lo : lo + cw.shape[0], : cw.shape[1]] = vw
        lo += cw.shape[0]
    return CoalitionPlan(cols, vals, targets, p, float(truncation_tol), exact_groups, tmc_groups)


def shapley_from_utilities(plan: CoalitionPlan, utilities: Tensor) -> ShapleyResult:
    """Shapley marginals ``phi_{j->i}`` (eq. 4; TMC for large ``P_i``) from the coalition utilities.

    Args:
        plan: from :func:`build_coalitions`.
        utilities: ``[R]`` validation AUROC of each coalition row (``ctx.evaluate_mixtures``); NaN
            allowed (a center whose validation split holds one class gets no observation).
    Returns:
        :class:`ShapleyResult`.
    Raises:
        ValueError: ``utilities`` does not have ``R`` entries.
    """
    n = plan.partners.shape[0]
    u = utilities.detach().to(torch.float64).cpu().reshape(-1)
    if u.numel() != plan.num_rows:
        raise ValueError(f"expected {plan.num_rows} coalition utilities, got {u.numel()}")
    phi = torch.full((n, n), float("nan"), dtype=torch.float64)
    u_local = torch.full((n,), float("nan"), dtype=torch.float64)
    u_full = torch.full((n,), float("nan"), dtype=torch.float64)
    for g in plan.exact_groups:
        c, m = g.partners.shape
        table = u[g.row0 : g.row0 + c * 2**m].reshape(c, 2**m)
        vals = table @ shapley_matrix(m)  # [c, m]; NaN propagates from any NaN coalition
        phi[g.centers[:, None], g.partners] = vals
        u_local[g.centers] = table[:, 0]
        u_full[g.centers] = table[:, -1]
    for g in plan.tmc_groups:
        c, b, m = g.perms.shape
        k_rows = 2 + b * (m - 1)
        block = u[g.row0 : g.row0 + c * k_rows].reshape(c, k_rows)
        empty, full = block[:, 0], block[:, 1]
        mid = block[:, 2:].reshape(c, b, m - 1)
        prefix = torch.cat([empty[:, None, None].expand(c, b, 1), mid, full[:, None, None].expand(c, b, 1)], dim=2)
        marg = prefix[:, :, 1:] - prefix[:, :, :-1]  # [c, B, m]: marginal of the L-th element of perm b
        if plan.truncation_tol > 0:
            close = (full[:, None, None] - prefix[:, :, :-1]).abs() < plan.truncation_tol
            truncated = torch.cumsum(close.to(torch.long), dim=2) > 0
            marg = torch.where(truncated, torch.zeros_like(marg), marg)
        credit = torch.zeros(c, b, m, dtype=torch.float64).scatter_(2, g.perms, marg)  # back to partner order
        phi[g.centers[:, None], g.partners] = credit.mean(dim=1)
        u_local[g.centers] = empty
        u_full[g.centers] = full
    observed = torch.isfinite(phi) & plan.partners
    return ShapleyResult(phi, observed, u_local, u_full)
