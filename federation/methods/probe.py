"""The anchor probe of SAGE, eq. (4), for every (receiver, candidate) pair at once.

A receiver sends anchor inputs (never labels) to its neighbours, gets back the predictions of their
post-local-update predictors and scores them against its own labels: the empirical 0-1 anchor risk
at every stage of the schedule (SAGE paper Sec. III), and the mean cross-entropy PENS and PFedDST read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from federation.data.image_shards import ClientShards
from federation.engine.image_model import StackedModel
from federation.methods.sage_rule import truncate_schedule


@dataclass
class ProbeTable:
    """One round's anchor evidence, padded over candidates and stages.

    Attributes:
        cand: long [K, D] neighbour ids of receiver k (padding -1), D = max degree.
        cand_valid: bool [K, D].
        degree: long [K] d_k.
        schedule: long [L] cumulative anchors m_1 < ... < m_L (untruncated).
        n_stages: long [K] L_k feasible stages after truncation (0: fewer than m_1 anchors).
        risk: float64 [K, D, L] empirical 0-1 anchor risk R_hat^(m_l)_{k,j} (eq. (4));
            meaningful where ``cand_valid`` and l < L_k.
        ce: float64 [K, D] mean cross-entropy of candidate j on receiver k's first m_{L_k}
            anchors (used by PENS and PFedDST), 0 where no anchors.
    """

    cand: Tensor
    cand_valid: Tensor
    degree: Tensor
    schedule: Tensor
    n_stages: Tensor
    risk: Tensor
    ce: Tensor


def draw_anchors(shards: ClientShards, m_max: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """This round's nested anchor sets: the first min(pool, m_max) of a fresh random pool order.

    Returns:
        (rows long [K, M] into x_train, valid bool [K, M]) with M = min(m_max, max pool).
    """
    k, width = shards.anchor_index.shape
    keys = torch.rand(k, width, generator=generator)
    keys = torch.where(torch.arange(width)[None, :] < shards.n_anchor[:, None], keys, torch.full_like(keys, 2.0))
    order = keys.argsort(dim=1)
    m = max(1, min(m_max, width))
    rows = shards.anchor_index.gather(1, order[:, :m])
    valid = torch.arange(m)[None, :] < shards.n_anchor.clamp(max=m_max)[:, None]
    return rows, valid


def probe(model: StackedModel, shards: ClientShards, cand: Tensor, cand_valid: Tensor, degree: Tensor,
          schedule: Tensor, anchor_rows: Tensor, anchor_valid: Tensor, with_ce: bool,
          own: bool = False) -> tuple[ProbeTable, Tensor | None]:
    """Score every candidate of every receiver on the receiver's anchors (eq. (4), 0-1 loss).

    The receiver sends anchor inputs only; each candidate j returns logits of its post-local-update
    predictor Theta_j^{t,+}; the receiver scores them against its own labels. All (receiver,
    candidate) pairs are evaluated in one batched pass (:meth:`StackedModel.pair_logits`).

    Returns:
        (ProbeTable, own_ce float64 [K] or None): own_ce is each receiver's own CE on its anchors.
    """
    k, d = cand.shape
    n_stages = truncate_schedule(schedule.tolist(), shards.n_anchor)
    pr, pc = cand_valid.nonzero(as_tuple=True)
    receivers = pr
    if own:
        receivers = torch.cat([pr, torch.arange(k)])
    models = cand[pr, pc] if not own else torch.cat([cand[pr, pc], torch.arange(k)])
    logits = model.pair_logits(shards.x_train, models, anchor_rows[receivers])
    y = shards.y_train[anchor_rows[receivers]]
    err = (logits.argmax(-1) != y).to(torch.float64)
    av = anchor_valid[receivers].to(torch.float64)
    cum = (err * av).cumsum(dim=1)
    m_width = anchor_rows.shape[1]
    risk = torch.zeros(k, d, len(schedule), dtype=torch.float64)
    idx = (schedule.clamp(max=m_width) - 1)
    n_pairs = pr.numel()
    risk[pr, pc] = cum[:n_pairs][:, idx] / schedule.to(torch.float64)[None, :]
    ce_tab = torch.zeros(k, d, dtype=torch.float64)
    own_ce = None
    if with_ce:
        # CE over the first m_{L_k} anchors (the largest feasible stage), the PENS/PFedDST evidence.
        m_last = torch.where(n_stages > 0, schedule.gather(0, (n_stages - 1).clamp(min=0)), torch.zeros_like(n_stages))
        use = (torch.arange(m_width)[None, :] < m_last[receivers][:, None]).to(torch.float64)
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        ce = ce.view(y.shape).to(torch.float64)
        mean_ce = (ce * use).sum(1) / use.sum(1).clamp(min=1)
        ce_tab[pr, pc] = mean_ce[:n_pairs]
        if own:
            own_ce = mean_ce[n_pairs:]
    return ProbeTable(cand, cand_valid, degree, schedule, n_stages, risk, ce_tab), own_ce


def empty_table(cand: Tensor, cand_valid: Tensor, degree: Tensor, schedule: Tensor,
                n_anchor: Tensor) -> ProbeTable:
    """The probe table of a round without a probe: zero risks and CE, the truncated stages only.

    Args:
        cand, cand_valid: long / bool [K, D] neighbour table; degree: long [K];
        schedule: long [L]; n_anchor: long [K] anchor-pool sizes.
    """
    n_stages = truncate_schedule(schedule.tolist(), n_anchor)
    return ProbeTable(cand, cand_valid, degree, schedule, n_stages,
                      torch.zeros(*cand.shape, len(schedule), dtype=torch.float64),
                      torch.zeros(cand.shape, dtype=torch.float64))
