"""Propose-reject topology with intentional rest (ABPS paper Sec. 4.3; Algorithm 1 lines 9-21).

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Matching", "propose_reject", "fedavg_mixing"]


@dataclass
class Matching:
    """Result of one propose-reject round.

    Attributes:
        partners: ``[n, n]`` bool, symmetric, False diagonal; ``partners[i, j]`` iff ``j`` in ``P_i``.
        proposals: ``[n]`` int64, proposals sent by each center this round.
        accepted: ``[n]`` int64, of those, how many were accepted.
        order: ``[n]`` int64, the order in which centers proposed.
        explored: ``[n]`` bool, whether the epsilon swap fired for the center.
    """

    partners: Tensor
    proposals: Tensor
    accepted: Tensor
    order: Tensor
    explored: Tensor

    @property
    def degree(self) -> Tensor:
        """``|P_i|`` per center, ``[n]`` int64."""
        return self.partners.sum(dim=1)

    @property
    def resting(self) -> Tensor:
        """``[n]`` bool, True where ``P_i`` is empty (intentional isolation, Lemma 1)."""
        return self.degree == 0

    def isolation_rate(self) -> float:
        """Share of centers with ``P_i`` empty."""
        return float(self.resting.to(torch.float64).mean())

    def acceptance_rate(self) -> float:
        """Accepted proposals / proposals sent (NaN when no proposal was sent)."""
        p = int(self.proposals.sum())
        return float(self.accepted.sum()) / p if p else float("nan")


def propose_reject(
    ucb: Tensor,
    candidates: Tensor,
    kappa: int,
    tau_acc: float,
    epsilon: float,
    rng: np.random.Generator,
    proposer_check: bool = True,
    acceptance: str = "first_come",
    available: Tensor | None = None,
) -> Matching:
    """Build this round's partner graph by propose-reject with rest (Sec. 4.3, Algorithm 1 lines 9-21).

    Args:
        ucb: ``[n, n]`` UCB scores, ``ucb[i, j]`` = center ``i``'s score of peer ``j`` (eq. 7).
        candidates: ``[n, n]`` bool candidate sets ``C_i`` (diagonal ignored).
        kappa: maximum partners per center (active-set cardinality), ``>= 1``.
        tau_acc: acceptance threshold on the receiver's UCB.
        epsilon: probability of the epsilon-greedy swap, in [0, 1].
        rng: numpy generator for this round (order, tie-breaks, swaps); same state -> same matching.
        proposer_check: see step 5 of the module docstring.
        acceptance: ``first_come`` or ``deferred``, step 7 of the module docstring.
        available: ``[n]`` bool centers up this round (federation/run/realworld.py), or None
            (all). An unavailable center proposes nothing, and a proposal to it fails (counted as
            sent, never accepted); the proposer goes on down its list. No belief changes: only
            partners are credited (after_exchange).
    Returns:
        :class:`Matching` (with ``deferred``, ``accepted`` counts the proposals that ended the round
        as partnerships).
    Raises:
        ValueError: bad shapes, ``kappa < 1``, ``epsilon`` outside [0, 1] or an unknown ``acceptance``.
    """
    n = ucb.shape[0]
    if tuple(ucb.shape) != (n, n) or tuple(candidates.shape) != (n, n):
        raise ValueError(f"ucb and candidates must be [n, n], got {tuple(ucb.shape)}, {tuple(candidates.shape)}")
    if kappa < 1:
        raise ValueError(f"kappa must be >= 1, got {kappa}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if acceptance not in ("first_come", "deferred"):
        raise ValueError(f"acceptance must be 'first_come' or 'deferred', got {acceptance!r}")
    u = ucb.detach().to(torch.float64).cpu().numpy()
    cand = candidates.detach().cpu().numpy().astype(bool).copy()
    np.fill_diagonal(cand, False)

    # All random draws up front, in a fixed order, so the stream does not depend on branches.
    order = rng.permutation(n)
    tie = rng.random((n, n))
    explore = rng.random(n) < epsilon
    swap_u = rng.random(n)

    size = cand.sum(axis=1)
    neg = np.where(cand, -u, np.inf)
    ranked = np.lexsort((tie, neg), axis=-1)  # per row: candidates by descending UCB, random ties, then the rest

    receiver_ok = (u >= tau_acc).T  # receiver_ok[i, j]: j's score of i clears tau_acc
    proposer_ok = u >= tau_acc if proposer_check else np.ones((n, n), dtype=bool)
    # --- realworld: availability hook ---
    up = np.ones(n, dtype=bool) if available is None else available.detach().cpu().numpy().astype(bool)
    receiver_ok = receiver_ok & up[None, :]
    # --- end realworld hook ---

    partners = np.zeros((n, n), dtype=bool)
    deg = np.zeros(n, dtype=np.int64)
    n_prop = np.zeros(n, dtype=np.int64)
    n_acc = np.zeros(n, dtype=np.int64)
    explored = np.zeros(n, dtype=bool)

    def proposal_list(i: int) -> np.ndarray:
        """``i``'s ranked list after the epsilon swap and the proposer-side threshold."""
        c = size[i]
        if not up[i]:  # realworld hook: an unavailable center does not propose
            return np.zeros(0, dtype=np.int64)
        lst = ranked[i, :c].copy()
        if explore[i]:
            r = min(int(swap_u[i] * c), c - 1)
            lst[0], lst[r] = lst[r], lst[0]
            explored[i] = True
        send = proposer_ok[i, lst]
        if explore[i]:
            send[0] = True
        return lst[send]

    if acceptance == "deferred":
        return _deferred(u, order, [proposal_list(i) if size[i] else np.zeros(0, np.int64) for i in range(n)],
                         receiver_ok, kappa, explored)

    for i in order:
        need = kappa - deg[i]
        if need <= 0 or size[i] == 0:
            continue
        lst = proposal_list(i)
        lst = lst[~partners[i, lst]]
        if lst.size == 0:
            continue
        ok = receiver_ok[i, lst] & (deg[lst] < kappa)
        hits = np.flatnonzero(ok)[:need]
        if hits.size == need:
            n_prop[i] += int(hits[-1]) + 1
        else:
            n_prop[i] += lst.size
        if hits.size:
            js = lst[hits]
            partners[i, js] = True
            partners[js, i] = True
            deg[i] += hits.size
            deg[js] += 1
            n_acc[i] += hits.size

    return Matching(
        partners=torch.from_numpy(partners),
        proposals=torch.from_numpy(n_prop),
        accepted=torch.from_numpy(n_acc),
        order=torch.from_numpy(order.astype(np.int64)),
        explored=torch.from_numpy(explored),
    )


def _deferred(u: np.ndarray, order: np.ndarray, lists: list[np.ndarray], receiver_ok: np.ndarray, kappa: int,
              explored: np.ndarray) -> Matching:
    """Deferred acceptance with trading up (step 7 of the module docstring), on numpy inputs.

    Args:
        u: ``[n, n]`` scores; ``lists[i]``: ``i``'s proposal list (ranked, swapped, thresholded);
        receiver_ok: ``[n, n]``, ``receiver_ok[i, j]`` iff ``u[j, i] >= tau_acc``.
    """
    n = u.shape[0]
    partners = np.zeros((n, n), dtype=bool)
    proposed = np.zeros((n, n), dtype=bool)  # proposed[i, j]: the partnership i-j came from i's proposal
    deg = np.zeros(n, dtype=np.int64)
    n_prop = np.zeros(n, dtype=np.int64)
    ptr = np.zeros(n, dtype=np.int64)
    queue = deque(int(i) for i in order)

    def worst(c: int) -> int:
        """``c``'s lowest-scored current partner (``-1`` when ``c`` has room)."""
        if deg[c] < kappa:
            return -1
        held = np.flatnonzero(partners[c])
        return int(held[np.argmin(u[c, held])])

    def drop(c: int, k: int) -> None:
        partners[c, k] = partners[k, c] = False
        proposed[c, k] = proposed[k, c] = False
        deg[c] -= 1
        deg[k] -= 1
        queue.append(k)  # k resumes proposing down its own list

    while queue:
        i = queue.popleft()
        lst = lists[i]
        while ptr[i] < lst.size:
            j = int(lst[ptr[i]])
            mine = worst(i)
            if mine >= 0 and not u[i, j] > u[i, mine]:
                break  # full, and the next candidate is no better than what i holds
            ptr[i] += 1
            if partners[i, j]:
                continue
            n_prop[i] += 1
            if not receiver_ok[i, j]:
                continue
            theirs = worst(j)
            if theirs >= 0:
                if not u[j, i] > u[j, theirs]:
                    continue
                drop(j, theirs)
            if mine >= 0:
                drop(i, mine)
            partners[i, j] = partners[j, i] = True
            proposed[i, j] = True
            deg[i] += 1
            deg[j] += 1
    return Matching(
        partners=torch.from_numpy(partners),
        proposals=torch.from_numpy(n_prop),
        accepted=torch.from_numpy(proposed.sum(axis=1).astype(np.int64)),
        order=torch.from_numpy(order.astype(np.int64)),
        explored=torch.from_numpy(explored),
    )


def center_weights(weights: Tensor | None, n: int) -> Tensor:
    """FedAvg weights ``[n]`` float64: ``weights`` (e.g. n_train) checked positive, or all ones.

    Raises:
        ValueError: ``weights`` is not ``[n]`` or has a non-positive entry.
    """
    if weights is None:
        return torch.ones(n, dtype=torch.float64)
    w = weights.to(torch.float64).reshape(-1)
    if w.numel() != n or not bool((w > 0).all()):
        raise ValueError(f"weights must be [{n}] and positive")
    return w


def fedavg_mixing(partners: Tensor, weights: Tensor | None = None) -> Tensor:
    """Row-stochastic mixing matrix of the ABPS exchange (Algorithm 1 line 23).

    Row ``i`` is the FedAvg of ``{i} U P_i``: ``W[i, j] = w_j / sum_{k in {i} U P_i} w_k`` for ``j`` in
    that set, 0 elsewhere. ``weights`` are the centers' training-set sizes for sample-weighted FedAvg
    (McMahan et al. 2017), or None for a uniform average. A resting center gets the identity row.

    Args:
        partners: ``[n, n]`` bool partner graph.
        weights: ``[n]`` positive weights, or None.
    Returns:
        ``[n, n]`` float64, rows sum to 1.
    Raises:
        ValueError: shape mismatch or a non-positive weight.
    """
    n = partners.shape[0]
    members = partners.to(torch.bool) | torch.eye(n, dtype=torch.bool)
    w = center_weights(weights, n)
    m = members.to(torch.float64) * w[None, :]
    return m / m.sum(dim=1, keepdim=True)
