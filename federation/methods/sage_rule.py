"""The SAGE decision rule: confidence radius, certificates, cost stop, gossip dominance, accounting.

Source: Xiao, Wang, Anagnostopoulos, "SAGE: Optimal-Stopping Peer Selection for Decentralised
Federated Learning", arXiv:2609.23773 (../shared/papers/sage-optimal-stopping-peer-selection.txt),
Sec. IV (eq. (7), (8), (19), (20), (22), (24), (25), Algorithm 1) and Sec. V-C (eq. (28)).

All functions are tensor functions that broadcast over leading axes (clients, stages), so one call
decides every client of a round. Risks are empirical anchor risks R_hat in [0, M]; with the 0-1
probe loss M = 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def confidence_radius(m: Tensor | float, degree: Tensor | float, n_stages: Tensor | float,
                      delta: float, loss_bound: float = 1.0) -> Tensor:
    """Stage-uniform Hoeffding radius r_l = M sqrt(log(2 d_k L / delta) / (2 m_l)), eq. (7).

    Args:
        m: cumulative anchors m_l at the stage (> 0), any shape.
        degree: receiver degree d_k = |N_k| (>= 1), broadcastable with ``m``.
        n_stages: L, the number of stages of the (possibly truncated) schedule (>= 1).
        delta: per-client-round failure probability in (0, 1).
        loss_bound: M, the bound of the per-example probe loss.
    Returns:
        float64 tensor of radii, broadcast shape.
    """
    m = torch.as_tensor(m, dtype=torch.float64)
    d = torch.as_tensor(degree, dtype=torch.float64)
    L = torch.as_tensor(n_stages, dtype=torch.float64)
    return loss_bound * torch.sqrt(torch.log(2.0 * d * L / delta) / (2.0 * m))


def best_two(risk: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Lowest and second-lowest empirical risks over candidates (last axis).

    Args:
        risk: float [..., D] empirical risks R_hat_{k,j}; valid: bool [..., D] candidate exists.
    Returns:
        (best value, index of the best candidate j_hat_1 (lowest index among ties), runner-up
        value); the runner-up is +inf when fewer than two candidates are valid.
    """
    r = torch.where(valid, risk.to(torch.float64), torch.full_like(risk, math.inf, dtype=torch.float64))
    j1 = r.argmin(dim=-1)                      # ties: the lowest candidate index (deterministic)
    best = r.gather(-1, j1.unsqueeze(-1)).squeeze(-1)
    rest = r.scatter(-1, j1.unsqueeze(-1), math.inf)
    return best, j1, rest.min(dim=-1).values


def runner_up_certificate(risk: Tensor, valid: Tensor, radius: Tensor) -> tuple[Tensor, Tensor]:
    """Best-versus-runner-up certificate (8): R_hat_{j2} - R_hat_{j1} > 2 r_l (Vanilla SAGE, SAGE-NF).

    A receiver with one valid candidate is certified trivially (the runner-up risk is +inf).

    Returns:
        (fires bool [...], index of j_hat_1 long [...]).
    """
    best, j1, second = best_two(risk, valid)
    return (second - best) > 2.0 * radius, j1


def advantage_over_gossip(risk: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Empirical neighbourhood risk and advantage, eq. (19).

    R_bar_l = (1/d_k) sum_j R_hat_{k,j};  A_l = R_bar_l - R_hat_{k, j_hat_1}.

    Returns:
        (A_l float64 [...], index of j_hat_1 long [...], R_bar_l float64 [...]).
    """
    v = valid.to(torch.float64)
    d = v.sum(dim=-1).clamp(min=1.0)
    r_bar = (torch.where(valid, risk.to(torch.float64), torch.zeros((), dtype=torch.float64)) * v).sum(-1) / d
    best, j1, _ = best_two(risk, valid)
    return r_bar - best, j1, r_bar


def gossip_certificate(advantage: Tensor, radius: Tensor) -> Tensor:
    """Advantage-over-gossip certificate (20): A_l > 2 r_l (SAGE-OS selects j_hat_1)."""
    return advantage > 2.0 * radius


def probe_stage_cost(lam: float, degree: Tensor | float, m_next: Tensor | float,
                     m_cur: Tensor | float) -> Tensor:
    """Normalised incremental stage cost C^probe_{l+1} = lambda d_k (m_{l+1} - m_l), eq. (22)."""
    d = torch.as_tensor(degree, dtype=torch.float64)
    return lam * d * (torch.as_tensor(m_next, dtype=torch.float64) - torch.as_tensor(m_cur, dtype=torch.float64))


def cost_stop(lam: float, degree: Tensor | float, m_cur: Tensor | float, m_next: Tensor | float,
              advantage: Tensor, radius: Tensor) -> Tensor:
    """Cost stop (24): C^probe_{l+1} >= [A_l + 2 r_l]_+ -> switch to random gossip."""
    bound = (advantage.to(torch.float64) + 2.0 * radius.to(torch.float64)).clamp(min=0.0)
    return probe_stage_cost(lam, degree, m_next, m_cur) >= bound


def gossip_dominance_threshold(lam: float, degree: float, m1: float) -> float:
    """Prop. 4: gossip is optimal when G_k = R_{k,RG} - min_j R_{k,j} <= lambda d_k m_1, eq. (25).

    At lambda = 2e-3, d_k = 6, m_1 = 16 this is 0.192 (the paper's "about 0.19").
    """
    return lam * degree * m1


def gossip_dominates(true_risk: Tensor, valid: Tensor, lam: float, m1: float) -> Tensor:
    """Eq. (25) on true risks [..., D]: lambda d_k m_1 >= G_k (bool [...])."""
    v = valid.to(torch.float64)
    d = v.sum(-1)
    r = true_risk.to(torch.float64)
    mean = (torch.where(valid, r, torch.zeros((), dtype=torch.float64))).sum(-1) / d.clamp(min=1)
    mn = torch.where(valid, r, torch.full_like(r, math.inf)).min(-1).values
    return lam * d * m1 >= mean - mn


def truncate_schedule(schedule: Sequence[int], pool_size: Tensor) -> Tensor:
    """Number of feasible stages L_k = #{l : m_l <= |anchor pool_k|} (Sec. V-B).

    The schedule is truncated to its largest feasible stage; L_k = 0 (fewer than m_1 anchors)
    means the client falls back directly to random gossip.

    Args:
        schedule: increasing cumulative anchor counts m_1 < ... < m_L.
        pool_size: long [K] anchor-pool sizes.
    Returns:
        long [K].
    """
    m = torch.as_tensor(list(schedule), dtype=torch.long)
    if m.numel() == 0 or bool((m[1:] <= m[:-1]).any()) or int(m[0]) < 1:
        raise ValueError(f"anchor schedule must be increasing positive integers, got {list(schedule)}")
    return (m[None, :] <= pool_size[:, None]).sum(dim=1)


def evidence_saving(anchors_used: Tensor, degree: Tensor, m_max: int) -> float:
    """Saving over a fixed m_max budget, eq. (28): 1 - sum d m / (m_max sum d).

    Args:
        anchors_used: m_{k,t} final anchor stage of each decision (0 when no anchor was probed),
            any shape; degree: d_{k,t}, same shape.
        m_max: nominal maximum budget (the last stage of the untruncated schedule, 128).
    Returns:
        Saving as a fraction in [0, 1] (budget consumed = 1 - Saving).
    """
    d = degree.to(torch.float64)
    den = m_max * d.sum()
    if float(den) == 0.0:
        return 0.0
    return float(1.0 - (d * anchors_used.to(torch.float64)).sum() / den)

