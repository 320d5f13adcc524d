"""ABPS and ABPS-X as federated methods of the runtime (ABPS paper, Algorithm 1; Sec. 4, 6.3-6.5).

One round of :class:`AbpsMethod` (the runner calls the hooks of :mod:`federation.methods.base`):

* ``plan_round`` (Algorithm 1 lines 9-21, 23): optional belief decay toward the prior (drift,
  Sec. 3); UCB of eq. (7) at ``t = round + 1``; propose-reject with rest over the goal-filtered
  candidate sets (eq. 3, computed once in ``setup`` because the metadata vectors are static); the
  exchange ``W`` = FedAvg over ``{i} U P_i`` (sample-weighted by ``n_train``, as the runtime's FedAvg;
  ``weighting: uniform`` for a plain mean). The partner graph is the ledger's adjacency: each
  partnership is one undirected edge carrying one payload (Sec. 6.3).
* ``after_exchange`` (lines 24-29): the validation AUROC ``U_i(S)`` of every coalition
  ``{i} U S, S subset P_i`` of every center, in ONE ``ctx.evaluate_mixtures`` call on the models as
  sent this round (bf16 wire and head personalization as in the exchange, server momentum not
  applied); Shapley marginals (eq. 4; exact for ``|P_i| <= 5``, else TMC with B = 8); the clip of
  eq. (5); the Beta update of eq. (6). Logged: isolation rate, mean ``|P_i|``, acceptance rate,
  proposals, mean phi and phi_bar, mean Shapley gain ``U_i(P_i) - U_i(empty)``.

Presets (Table 1) are subclasses that only change ``default_config``: ``abps``, ``abps+p``,
``abps+q``, ``abps+p+q+k1``, ``abps-hom``, ``abps-div``, ``abps-align``, ``abps-x``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from abps.beliefs import BetaBeliefs
from abps.drift import DriftParams, PrivacyDriftHooks
from abps.goal_filter import candidate_mask
from abps.matching import Matching, fedavg_mixing, propose_reject
from abps.privacy import MetadataDpParams
from abps.shapley import ShapleyResult, build_coalitions, clip_phi, shapley_from_utilities
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.registry import register

__all__ = ["AbpsParams", "AbpsMethod", "PRESETS"]

_META_BYTES_PER_VALUE = 4  # metadata vectors travel as float32


class AbpsParams(MetadataDpParams, DriftParams):
    """ABPS hyperparameters (paper Sec. 6.3 defaults; config key ``params:``).

    Attributes:
        kappa: active-set cardinality (max partners per center).
        epsilon: probability of the epsilon-greedy swap (Algorithm 1 line 12).
        gamma: UCB exploration weight (eq. 7).
        tau_acc: acceptance threshold on the receiver's UCB (Sec. 4.3); equals c_neg = 0.5 of Lemma 1.
        alpha0, beta0: Beta prior.
        goal: goal-aware pre-filter (eq. 3) or None for no filter.
        keep_fraction: fraction of peer pairs the filter keeps (tau_sim auto-calibration).
        metadata: ``base`` (3-dim), ``full`` (15-dim with Charlson prevalences) or ``auto``
            (15-dim when a goal is set, else 3-dim; Sec. 6.3).
        normalize_metadata: z-score metadata coordinates before the cosine (docs/abps.md).
        phi_min, phi_max: affine clip of eq. (5).
        shapley_exact_max: largest ``|P_i|`` with exact Shapley (paper: 5).
        tmc_permutations: TMC permutations B (paper: 8).
        tmc_truncation: TMC truncation tolerance in AUROC units (0 = none).
        weighting: FedAvg weights of the exchange and of every coalition: ``samples`` (n_train) or ``uniform``.
        belief_decay: rho of the between-round decay toward the prior (1 = off).
        proposer_check: a center proposes only to candidates with its own UCB >= tau_acc (besides the
            epsilon-swapped one); False = literal Algorithm 1 (see :mod:`abps.matching`).
        metadata_dp_*: DP release of v_i (:class:`abps.privacy.MetadataDpParams`; off by default).
        drift_*: Welch-t drift windows (:class:`abps.drift.DriftParams`; off by default).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kappa: int = Field(3, ge=1)
    epsilon: float = Field(0.1, ge=0.0, le=1.0)
    gamma: float = Field(2.0, ge=0.0)
    tau_acc: float = Field(0.5, ge=0.0)
    alpha0: float = Field(1.0, gt=0.0)
    beta0: float = Field(1.0, gt=0.0)
    goal: Literal["homogeneity", "diversity", "alignment"] | None = None
    keep_fraction: float = Field(0.25, gt=0.0, le=1.0)
    metadata: Literal["auto", "base", "full"] = "auto"
    normalize_metadata: bool = True
    phi_min: float = -0.1
    phi_max: float = 0.1
    shapley_exact_max: int = Field(5, ge=1, le=12)
    tmc_permutations: int = Field(8, ge=1)
    tmc_truncation: float = Field(0.0, ge=0.0)
    weighting: Literal["samples", "uniform"] = "samples"
    belief_decay: float = Field(1.0, ge=0.0, le=1.0)
    proposer_check: bool = True

    @model_validator(mode="after")
    def _clip_range(self) -> "AbpsParams":
        if not self.phi_max > self.phi_min:
            raise ValueError("phi_max must be greater than phi_min")
        return self

    @property
    def metadata_dim(self) -> int:
        """3 or 15: which metadata vector the filter uses."""
        if self.metadata == "auto":
            return 15 if self.goal is not None else 3
        return 15 if self.metadata == "full" else 3


@register(display_name="ABPS (base, κ=3)", family="abps", paper_order=10)
class AbpsMethod(PrivacyDriftHooks, Method):
    """Adaptive Bayesian Partner Selection (ABPS paper, Algorithm 1), base preset (kappa 3, no filter).

    State (per run): :class:`abps.beliefs.BetaBeliefs` ``[n, n]``, the candidate mask ``[n, n]``, the
    last round's :class:`abps.matching.Matching`, and per-center counters (rounds rested, partners
    held). Use :meth:`belief_summary` for the per-center artifact (keyed by center_id only).
    """

    name: ClassVar[str] = "abps"
    Params: ClassVar[type[BaseModel]] = AbpsParams
    default_config: ClassVar[dict[str, Any]] = {}

    def setup(self, ctx: Context) -> None:
        """Prior beliefs, the goal-aware candidate sets, FedAvg weights."""
        p: AbpsParams = self.p  # type: ignore[assignment]
        n = ctx.n
        self.beliefs = BetaBeliefs.prior(n, p.alpha0, p.beta0)
        meta = ctx.meta if p.metadata_dim == 15 else ctx.meta_base
        self.meta_dim = int(meta.shape[1])
        meta = self._publish_metadata(ctx, meta)  # DP release (abps.privacy); drift windows (abps.drift)
        self.candidates, self.tau_sim = candidate_mask(meta.double(), p.goal, p.keep_fraction, p.normalize_metadata)
        self.weights = ctx.n_train.double() if p.weighting == "samples" else None
        self.last: Matching | None = None
        self.last_credit: ShapleyResult | None = None
        self.rested = torch.zeros(n, dtype=torch.long)
        self.partner_rounds = torch.zeros(n, dtype=torch.long)
        self.rounds_seen = 0

    def _rng(self, ctx: Context, round_idx: int, stream: int) -> np.random.Generator:
        """Per-(seed, round, stream) numpy generator: same seed -> same draws, independent of history."""
        return np.random.default_rng([int(ctx.seed), int(round_idx), int(stream), 0xAB95])

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """Beliefs -> UCB -> propose-reject with rest -> ``W`` (Algorithm 1 lines 9-23)."""
        p: AbpsParams = self.p  # type: ignore[assignment]
        if round_idx > 0 and p.belief_decay < 1.0:
            self.beliefs.decay(p.belief_decay)
        ucb = self.beliefs.ucb(round_idx + 1, p.gamma)
        m = propose_reject(
            ucb, self.candidates, p.kappa, p.tau_acc, p.epsilon, self._rng(ctx, round_idx, 0), p.proposer_check
        )
        self.last = m
        w = fedavg_mixing(m.partners, self.weights)
        meta_bytes = ctx.n * self.meta_dim * _META_BYTES_PER_VALUE if (round_idx == 0 and p.goal is not None) else 0
        meta_bytes += self._take_resend_bytes()
        return RoundPlan(w=w, adjacency=m.partners, metadata_bytes=meta_bytes)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        """Shapley credit of every partner from one batched coalition evaluation, then the Beta update."""
        p: AbpsParams = self.p  # type: ignore[assignment]
        m = self.last
        if m is None:
            raise RuntimeError("after_exchange called before plan_round")
        coal = build_coalitions(
            m.partners, self.weights, p.shapley_exact_max, p.tmc_permutations, p.tmc_truncation,
            self._rng(ctx, round_idx, 1),
        )
        if coal.num_rows:
            # rows ordered by the target's validation size (largest first), so that each evaluation
            # chunk holds centers of similar size (less padding when the runtime trims per chunk)
            order = torch.argsort(ctx.data.splits["val"].n[coal.targets], descending=True, stable=True)
            util = torch.empty(coal.num_rows, dtype=torch.float64)
            util[order] = ctx.evaluate_mixtures(coal.mixing[order], coal.targets[order], split="val").double()
        else:
            util = torch.zeros(0, dtype=torch.float64)
        res = shapley_from_utilities(coal, util)
        self.last_credit = res
        phi_bar = clip_phi(res.phi, p.phi_min, p.phi_max)
        self.beliefs.update(phi_bar, res.observed)
        drift_extras = self._drift_step(ctx, phi_bar, res.observed)

        deg = m.degree
        self.rested += (deg == 0).to(torch.long)
        self.partner_rounds += deg
        self.rounds_seen += 1
        obs = res.observed
        gain = res.u_full - res.u_local
        fin = torch.isfinite(gain)
        nan = float("nan")
        return {
            "isolation_rate": m.isolation_rate(),
            "mean_partners": float(deg.to(torch.float64).mean()),
            "acceptance_rate": m.acceptance_rate(),
            "proposals": float(m.proposals.sum()),
            "partnerships": float(torch.triu(m.partners, 1).sum()),
            "coalitions_evaluated": float(coal.num_rows),
            "mean_phi": float(res.phi[obs].mean()) if obs.any() else nan,
            "mean_phi_bar": float(phi_bar[obs].mean()) if obs.any() else nan,
            "mean_shapley_gain": float(gain[fin].mean()) if fin.any() else nan,
            "mean_belief": float(self.beliefs.mean()[~torch.eye(ctx.n, dtype=torch.bool)].mean()),
            **drift_extras,
        }

    def belief_summary(self, ctx: Context) -> list[dict[str, Any]]:
        """Per-center belief summary rows for an artifact, keyed by ``center_id`` (no patient data).

        Each row: center_id, rounds_rested, rest_share, mean_partners, mean_belief, max_belief,
        best_peer (a center_id, or None before any observation), pulls, peers_observed, candidates.
        """
        s = self.beliefs.summary()
        ids = list(ctx.data.center_ids)
        rounds = max(self.rounds_seen, 1)
        cand = self.candidates.sum(dim=1)
        rows = []
        for i, cid in enumerate(ids):
            observed = int(s["n_peers_observed"][i]) > 0
            rows.append({
                "center_id": cid,
                "rounds_rested": int(self.rested[i]),
                "rest_share": float(self.rested[i]) / rounds,
                "mean_partners": float(self.partner_rounds[i]) / rounds,
                "mean_belief": float(s["mean_belief"][i]),
                "max_belief": float(s["max_belief"][i]),
                "best_peer": ids[int(s["best_peer"][i])] if observed else None,
                "pulls": float(s["pulls"][i]),
                "peers_observed": int(s["n_peers_observed"][i]),
                "candidates": int(cand[i]),
            })
        return rows


    def artifacts(self, ctx: Context) -> dict[str, Any]:
        """JSON artifacts of the run: ``{"abps_beliefs.json": [per-center rows]}`` (center ids only).

        The runner logs each entry with ``tracker.log_json(obj, name)`` when the method defines this hook.
        """
        return {"abps_beliefs.json": self.belief_summary(ctx)}


def _preset(name: str, doc: str, config: dict[str, Any], display_name: str, family: str,
            paper_order: int | None) -> type[AbpsMethod]:
    """A registered ABPS preset: a subclass that only changes ``name`` and ``default_config``
    (registered with :func:`federation.methods.registry.register`: Table 1 row name, Figure 3
    family, Table 1 row index)."""
    cls = type(
        "Abps_" + "".join(ch if ch.isalnum() else "_" for ch in name),
        (AbpsMethod,),
        {"name": name, "default_config": config, "__doc__": doc, "__module__": __name__},
    )
    return register(display_name=display_name, family=family, paper_order=paper_order)(cls)  # type: ignore[return-value]


_PQ = {"head_layers": 1, "bf16_wire": True}
_GOAL_PARAMS = {"kappa": 1, "metadata": "full", "keep_fraction": 0.25}

PRESETS: dict[str, type[AbpsMethod]] = {
    "abps": AbpsMethod,
    "abps+p": _preset("abps+p", "ABPS+P (Table 1): last layer personalized (kept local).",
                      {"exchange": {"head_layers": 1}}, "ABPS+P (personalize)", "abps", 11),
    "abps+q": _preset("abps+q", "ABPS+Q (Table 1): bfloat16 wire format.", {"exchange": {"bf16_wire": True}},
                      "ABPS+Q (bfloat16)", "abps", 12),
    "abps+p+q+k1": _preset("abps+p+q+k1", "ABPS+P+Q+kappa=1 (Table 1).",
                           {"exchange": dict(_PQ), "params": {"kappa": 1}}, "ABPS+P+Q+κ=1", "abps", 13),
    "abps-hom": _preset("abps-hom", "ABPS+P+Q+kappa=1 with the homogeneity goal (Table 1, Sec. 6.5).",
                        {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "homogeneity"}},
                        "ABPS+P+Q+κ=1 (hom.)", "goal", 15),
    "abps-div": _preset("abps-div", "ABPS+P+Q+kappa=1 with the diversity goal (Table 1, Sec. 6.5).",
                        {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "diversity"}},
                        "ABPS+P+Q+κ=1 (div.)", "goal", 16),
    "abps-align": _preset("abps-align", "ABPS+P+Q+kappa=1 with the alignment goal (Table 1, Sec. 6.5).",
                          {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "alignment"}},
                          "ABPS+P+Q+κ=1 (align.)", "goal", 17),
    "abps-drift": _preset("abps-drift", "Base ABPS with the online Welch-t drift windows (abps.drift; Sec. 7 iii).",
                          {"params": {"drift_window": 4, "drift_alpha": 0.01}}, "ABPS + drift windows", "abps", None),
    "abps-x": _preset(
        "abps-x",
        "ABPS-X (Sec. 6.4): 2-layer head, bf16, kappa 1, server EMA beta 0.5, 15-dim metadata, homogeneity, "
        "val-AUROC early stopping (patience 10 of at most 100 rounds).",
        {
            "exchange": {"head_layers": 2, "bf16_wire": True, "server_momentum": 0.5},
            "early_stopping": {"enabled": True, "patience": 10, "max_rounds": 100},
            "params": {**_GOAL_PARAMS, "goal": "homogeneity"},
        },
        "ABPS-X (ours, full)", "abps-x", 18,
    ),
}
