"""ABPS and ABPS-X as methods of the runtime (ABPS paper, Algorithm 1; Sec. 4, 6.3-6.5) and their
Table 1 presets (subclasses that change only ``default_config``). The round's hooks, step by step:
docs/abps.md, "Module notes".
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
from etl.errors import InputError
from federation.core.checks import check_finite
from federation.methods.base import Context, Method, RoundPlan
from federation.methods.registry import register

__all__ = ["SelectionParams", "AbpsParams", "AbpsMethod", "RandomPartnersMethod", "PRESETS"]

_META_BYTES_PER_VALUE = 4  # metadata vectors travel as float32


#: parameters read only by the goal-aware filter (eq. 3, :func:`abps.goal_filter.candidate_mask`)
_FILTER_SETTINGS = ("keep_fraction", "tau_mode", "candidacy", "metadata", "normalize_metadata")


class SelectionParams(MetadataDpParams):
    """Partner-selection settings shared by ABPS and the ``random-partners`` ablation (config ``params:``).

    Attributes:
        kappa: active-set cardinality (max partners per center).
        goal: goal-aware pre-filter (eq. 3) or None for no filter.
        keep_fraction: fraction of peer pairs (``tau_mode: global``) or of each center's peers
            (``per_center``) the filter keeps (tau_sim auto-calibration).
        tau_mode: ``global`` (one tau_sim per goal, Sec. 4.1) or ``per_center`` (each center keeps its
            own top keep_fraction of peers, Sec. 6.5 / App. C.2); see :mod:`abps.goal_filter`.
        candidacy: with ``per_center`` the sets are one-sided: ``proposer`` (i may propose to j iff
            j in C_i; Algorithm 1) or ``mutual`` (also i in C_j); docs/abps.md.
        metadata: ``base`` (3-dim), ``full`` (15-dim with Charlson prevalences) or ``auto``
            (15-dim when a goal is set, else 3-dim; Sec. 6.3).
        normalize_metadata: z-score metadata coordinates before the cosine (docs/abps.md); default off.
        weighting: FedAvg weights of the exchange and of every coalition: ``samples`` (n_train) or ``uniform``.
        watch_centers: center_ids whose partnerships are counted apart (the harmful-center study,
            :mod:`abps.harmful`): adds per-round ``watched_partnership_share`` (partnerships with at
            least one watched center / all partnerships), ``mixed_partnership_share`` (exactly one
            watched end) and ``unwatched_test_auroc_mean`` (mean test AUROC of the other centers after
            the exchange).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kappa: int = Field(3, ge=1)
    goal: Literal["homogeneity", "diversity", "alignment"] | None = None
    keep_fraction: float = Field(0.25, gt=0.0, le=1.0)
    # the default reading is the fidelity study's choice (docs/fidelity.md): per-center tau_sim, mutual
    # candidacy, raw metadata
    tau_mode: Literal["global", "per_center"] = "per_center"
    candidacy: Literal["proposer", "mutual"] = "mutual"
    metadata: Literal["auto", "base", "full"] = "auto"
    normalize_metadata: bool = False
    weighting: Literal["samples", "uniform"] = "samples"
    watch_centers: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _dp_needs_a_release(self) -> SelectionParams:
        # without a goal no metadata is released (Algorithm 1 line 10 runs only for the goal-aware
        # filter), so a DP setting would do nothing: refused, never ignored. epsilon unset, null or
        # inf is the mechanism off, which holds trivially.
        # (by value, not by which fields were given: a dumped config lists every default again)
        off = (None, float("inf"))
        dp = sorted((k for k, f in MetadataDpParams.model_fields.items()
                     if (getattr(self, k) not in off if k == "metadata_dp_epsilon" else getattr(self, k) != f.default)),
                    key=lambda k: (k != "metadata_dp_epsilon", k))
        if dp and self.goal is None:
            raise ValueError(f"{dp[0]} applies only when metadata is released, i.e. with a goal "
                             "(--goal, or the presets abps-hom | abps-div | abps-align); without a goal "
                             "no metadata leaves a center")
        # the goal-aware filter's settings: without a goal every peer is a candidate (eq. 3 is not applied)
        fields = type(self).model_fields
        unused = [k for k in _FILTER_SETTINGS if getattr(self, k) != fields[k].default]
        if unused and self.goal is None:
            raise ValueError(f"{unused[0]} is a setting of the goal-aware filter, which runs only with a goal "
                             "(--goal, or the presets abps-hom | abps-div | abps-align); without a goal every "
                             "peer is a candidate")
        return self

    @property
    def metadata_dim(self) -> int:
        """3 or 15: which metadata vector the filter uses."""
        if self.metadata == "auto":
            return 15 if self.goal is not None else 3
        return 15 if self.metadata == "full" else 3


class AbpsParams(SelectionParams, DriftParams):
    """ABPS hyperparameters (paper Sec. 6.3 defaults): :class:`SelectionParams` plus

    Attributes:
        epsilon: probability of the epsilon-greedy swap (Algorithm 1 line 12).
        gamma: UCB exploration weight of eq. (7). The paper's text reads "gamma = 2" with a stray
            square-root sign nearby; 2, sqrt(2) (1.4142135623730951) and smaller values are all
            accepted (docs/fidelity.md compares them; :func:`abps.beliefs.max_resting_gamma` says when
            a UCB can fall below tau_acc at all).
        tau_acc: acceptance threshold on the receiver's UCB (Sec. 4.3); equals c_neg = 0.5 of Lemma 1.
        alpha0, beta0: Beta prior.
        phi_min, phi_max: affine clip of eq. (5).
        shapley_exact_max: largest ``|P_i|`` with exact Shapley (paper: 5).
        tmc_permutations: TMC permutations B (paper: 8).
        tmc_truncation: TMC truncation tolerance in AUROC units (0 = none; :mod:`abps.shapley`).
        belief_decay: rho of the between-round decay toward the prior (1 = off).
        proposer_check: a center proposes only to candidates with its own UCB >= tau_acc (besides the
            epsilon-swapped one); False = literal Algorithm 1 (see :mod:`abps.matching`).
        acceptance: receiver rule of the propose-reject step: ``first_come`` (literal Algorithm 1 line
            17) or ``deferred`` (Gale-Shapley deferred acceptance, Sec. 4.3 "approximating a
            stable-marriage solution": a full receiver trades its lowest-UCB partner for a proposer it
            scores strictly higher); :mod:`abps.matching` step 7, docs/fidelity.md.
    """

    epsilon: float = Field(0.1, ge=0.0, le=1.0)
    gamma: float = Field(2.0, ge=0.0)
    tau_acc: float = Field(0.5, ge=0.0)
    alpha0: float = Field(1.0, gt=0.0)
    beta0: float = Field(1.0, gt=0.0)
    phi_min: float = -0.1
    phi_max: float = 0.1
    shapley_exact_max: int = Field(5, ge=1, le=12)
    tmc_permutations: int = Field(8, ge=1)
    tmc_truncation: float = Field(0.0, ge=0.0)
    belief_decay: float = Field(1.0, ge=0.0, le=1.0)
    proposer_check: bool = True
    acceptance: Literal["first_come", "deferred"] = "first_come"

    @model_validator(mode="after")
    def _clip_range(self) -> AbpsParams:
        if not self.phi_max > self.phi_min:
            raise ValueError("phi_max must be greater than phi_min")
        return self


@register(display_name="ABPS (base, κ=3)", family="abps", paper_order=10)
class AbpsMethod(PrivacyDriftHooks, Method):
    """Adaptive Bayesian Partner Selection (ABPS paper, Algorithm 1), base preset (kappa 3, no filter).

    State (per run): :class:`abps.beliefs.BetaBeliefs` ``[n, n]``, the candidate mask ``[n, n]``, the
    last round's :class:`abps.matching.Matching`, and per-center counters (rounds rested, partners
    held). Use :meth:`belief_summary` for the per-center artifact (keyed by center_id only).
    """

    name: ClassVar[str] = "abps"
    seconds_per_round = 0.80
    Params: ClassVar[type[BaseModel]] = AbpsParams
    default_config: ClassVar[dict[str, Any]] = {}

    def setup(self, ctx: Context) -> None:
        """Prior beliefs, the goal-aware candidate sets, FedAvg weights."""
        p: AbpsParams = self.p  # type: ignore[assignment]
        self.beliefs = BetaBeliefs.prior(ctx.n, p.alpha0, p.beta0)
        self._setup_selection(ctx)

    def _setup_selection(self, ctx: Context) -> None:
        """The goal-aware candidate sets, FedAvg weights, the run counters, the watched centers."""
        p: SelectionParams = self.p  # type: ignore[assignment]
        n = ctx.n
        meta = ctx.meta if p.metadata_dim == 15 else ctx.meta_base
        self.meta_dim = int(meta.shape[1])
        meta = self._publish_metadata(ctx, meta)  # DP release (abps.privacy); drift windows (abps.drift)
        self.candidates, self.tau_sim = candidate_mask(
            meta.double(), p.goal, p.keep_fraction, p.normalize_metadata, p.tau_mode, p.candidacy
        )
        self.weights = ctx.n_train.double() if p.weighting == "samples" else None
        self.last: Matching | None = None
        self.last_credit: ShapleyResult | None = None
        self.rested = torch.zeros(n, dtype=torch.long)
        self.partner_rounds = torch.zeros(n, dtype=torch.long)
        self.rounds_seen = 0
        self.totals = torch.zeros(3, dtype=torch.float64)  # sum of isolation rates, proposals, acceptances
        ids = list(ctx.data.center_ids)
        unknown = sorted(set(p.watch_centers) - set(ids))
        if unknown:
            raise InputError(f"params.watch_centers: unknown center_id {unknown[0]!r} (the cohort's "
                             f"centers.parquet lists {len(ids)} centers)")
        self.watched = torch.tensor([c in set(p.watch_centers) for c in ids], dtype=torch.bool)

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
            ucb, self.candidates, p.kappa, p.tau_acc, p.epsilon, self._rng(ctx, round_idx, 0), p.proposer_check,
            acceptance=p.acceptance,
            available=ctx.available,  # realworld hook: proposals to an unavailable peer fail
        )
        return self._plan(ctx, round_idx, m)

    def _plan(self, ctx: Context, round_idx: int, m: Matching) -> RoundPlan:
        """The round plan of a matching: FedAvg over ``{i} U P_i``, the partner graph as ledger edges,
        the metadata vectors once in round 1 when a goal is set."""
        p: SelectionParams = self.p  # type: ignore[assignment]
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
            # sparse rows (kappa + 1 members each); the runtime orders them by validation size
            util = ctx.evaluate_mixtures(coal.mixing_sparse, coal.targets, split="val").double()
        else:
            util = torch.zeros(0, dtype=torch.float64)
        res = shapley_from_utilities(coal, util)
        where = (ctx.cfg.method, ctx.seed, round_idx + 1)
        check_finite("Shapley values", res.phi[res.observed], *where)  # unobserved pairs are NaN by design
        self.last_credit = res
        phi_bar = clip_phi(res.phi, p.phi_min, p.phi_max)
        self.beliefs.update(phi_bar, res.observed)
        check_finite("Beta beliefs", (self.beliefs.alpha, self.beliefs.beta), *where)
        drift_extras = self._drift_step(ctx, phi_bar, res.observed)

        nan = float("nan")
        obs = res.observed
        gain = res.u_full - res.u_local
        fin = torch.isfinite(gain)
        return {
            **self._selection_metrics(ctx, m),
            "coalitions_evaluated": float(coal.num_rows),
            "mean_phi": float(res.phi[obs].mean()) if obs.any() else nan,
            "mean_phi_bar": float(phi_bar[obs].mean()) if obs.any() else nan,
            "mean_shapley_gain": float(gain[fin].mean()) if fin.any() else nan,
            "mean_belief": float(self.beliefs.mean()[~torch.eye(ctx.n, dtype=torch.bool)].mean()),
            **drift_extras,
        }

    def _selection_metrics(self, ctx: Context, m: Matching) -> dict[str, float]:
        """Book one round's matching into the run counters; the round's selection metrics.

        Keys: isolation_rate, mean_partners, acceptance_rate, proposals, partnerships; with
        ``watch_centers`` also watched_partnership_share (at least one end watched),
        mixed_partnership_share (exactly one end watched) and unwatched_test_auroc_mean.
        """
        deg = m.degree
        self.rested += (deg == 0).to(torch.long)
        self.partner_rounds += deg
        self.rounds_seen += 1
        self.totals += torch.tensor([m.isolation_rate(), float(m.proposals.sum()), float(m.accepted.sum())],
                                    dtype=torch.float64)
        upper = torch.triu(m.partners, 1)
        out = {
            "isolation_rate": m.isolation_rate(),
            "mean_partners": float(deg.to(torch.float64).mean()),
            "acceptance_rate": m.acceptance_rate(),
            "proposals": float(m.proposals.sum()),
            "partnerships": float(upper.sum()),
        }
        if bool(self.watched.any()):
            edges = int(upper.sum())
            w = self.watched
            touched = int((upper & (w[:, None] | w[None, :])).sum())
            mixed = int((upper & (w[:, None] ^ w[None, :])).sum())
            out["watched_partnership_share"] = touched / edges if edges else float("nan")
            out["mixed_partnership_share"] = mixed / edges if edges else float("nan")
            auroc = ctx.evaluate("test")[~w]
            ok = torch.isfinite(auroc)
            out["unwatched_test_auroc_mean"] = float(auroc[ok].mean()) if ok.any() else float("nan")
        return out

    def final_metrics(self, ctx: Context) -> dict[str, Any]:
        """Per-seed isolation summary for results.json and the final MLflow metrics.

        Keys: ``rest_share_mean`` (mean over rounds of the share of centers with ``P_i`` empty),
        ``partners_mean`` (E|P_i| over centers and rounds), ``run_acceptance_rate`` (accepted / sent over
        the whole run; NaN when nothing was sent), ``centers_ever_rested`` (count), and
        ``rounds_rested`` (``{center_id: rounds rested}`` for centers that rested at least once; an
        aggregate per center, nothing row-level). Floats are logged as MLflow metrics by the runner.
        """
        rounds = max(self.rounds_seen, 1)
        sent = float(self.totals[1])
        ids = list(ctx.data.center_ids)
        return {
            "rest_share_mean": float(self.totals[0]) / rounds,
            "partners_mean": float(self.partner_rounds.sum()) / (rounds * ctx.n),
            "run_acceptance_rate": float(self.totals[2]) / sent if sent else float("nan"),
            "centers_ever_rested": float((self.rested > 0).sum()),
            "rounds_rested": {ids[i]: int(self.rested[i]) for i in torch.nonzero(self.rested).flatten().tolist()},
            **self._privacy_drift_metrics(),  # DP budget spent, drift totals (abps.drift)
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


@register(display_name="Random partners (ablation, κ=1)", family="abps")
class RandomPartnersMethod(AbpsMethod):
    """``random-partners``: the ablation of ABPS's Bayesian selection.

    Same goal-aware candidate sets (eq. 3, same ``tau_mode`` / ``candidacy``), same kappa, same
    propose-reject capacity rule and the same FedAvg exchange over ``{i} U P_i`` as ABPS, but every
    center ranks its candidates in a uniformly random order each round: no beliefs, no UCB, no
    acceptance threshold (every receiver with ``|P_j| < kappa`` accepts), no Shapley evaluation. A
    center rests only when capacity leaves it without a partner. Defaults match ``abps+p+q+k1``
    (last layer personalized, bf16 wire, kappa 1), the row of Table 1 whose "2x reduction" the paper
    credits to the Bayesian Shapley-UCB selection.
    """

    name: ClassVar[str] = "random-partners"
    seconds_per_round = 0.60
    Params: ClassVar[type[BaseModel]] = SelectionParams
    default_config: ClassVar[dict[str, Any]] = {"exchange": {"head_layers": 1, "bf16_wire": True},
                                                "params": {"kappa": 1}}

    def setup(self, ctx: Context) -> None:
        """Candidate sets, FedAvg weights and counters (no beliefs)."""
        self._setup_selection(ctx)

    def plan_round(self, ctx: Context, round_idx: int) -> RoundPlan:
        """Uniformly random candidate order -> propose-reject (capacity only) -> ``W``.

        All scores are equal (0) and ``tau_acc = 0``, so :func:`abps.matching.propose_reject` ranks
        every candidate list by its uniform random tie key and every receiver below capacity accepts.
        """
        p: SelectionParams = self.p  # type: ignore[assignment]
        zeros = torch.zeros(ctx.n, ctx.n, dtype=torch.float64)
        m = propose_reject(zeros, self.candidates, p.kappa, 0.0, 0.0, self._rng(ctx, round_idx, 0), True,
                           available=ctx.available)  # realworld hook
        return self._plan(ctx, round_idx, m)

    def after_exchange(self, ctx: Context, round_idx: int, plan: RoundPlan) -> dict[str, float]:
        """The round's selection metrics (no Shapley credit, no belief update)."""
        if self.last is None:
            raise RuntimeError("after_exchange called before plan_round")
        return self._selection_metrics(ctx, self.last)

    def artifacts(self, ctx: Context) -> dict[str, Any]:
        """No beliefs to report: rest counts are in :meth:`final_metrics`."""
        return {}


def _preset(name: str, doc: str, config: dict[str, Any], display_name: str, family: str,
            paper_order: int | None, seconds_per_round: float) -> type[AbpsMethod]:
    """A registered ABPS preset: a subclass that only changes ``name`` and ``default_config``
    (registered with :func:`federation.methods.registry.register`: Table 1 row name, Figure 3
    family, Table 1 row index)."""
    cls = type(
        "Abps_" + "".join(ch if ch.isalnum() else "_" for ch in name),
        (AbpsMethod,),
        {"name": name, "default_config": config, "__doc__": doc, "__module__": __name__,
         "seconds_per_round": seconds_per_round},
    )
    return register(display_name=display_name, family=family, paper_order=paper_order)(cls)  # type: ignore[return-value]


_PQ = {"head_layers": 1, "bf16_wire": True}
_GOAL_PARAMS = {"kappa": 1, "metadata": "full", "keep_fraction": 0.25}

PRESETS: dict[str, type[AbpsMethod]] = {
    "abps": AbpsMethod,
    "random-partners": RandomPartnersMethod,
    "abps+p": _preset("abps+p", "ABPS+P (Table 1): last layer personalized (kept local).",
                      {"exchange": {"head_layers": 1}}, "ABPS+P (personalize)", "abps", 11, 0.85),
    "abps+q": _preset("abps+q", "ABPS+Q (Table 1): bfloat16 wire format.", {"exchange": {"bf16_wire": True}},
                      "ABPS+Q (bfloat16)", "abps", 12, 0.85),
    "abps+p+q+k1": _preset("abps+p+q+k1", "ABPS+P+Q+kappa=1 (Table 1).",
                           {"exchange": dict(_PQ), "params": {"kappa": 1}}, "ABPS+P+Q+κ=1", "abps", 13, 0.65),
    "abps-hom": _preset("abps-hom", "ABPS+P+Q+kappa=1 with the homogeneity goal (Table 1, Sec. 6.5).",
                        {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "homogeneity"}},
                        "ABPS+P+Q+κ=1 (hom.)", "goal", 15, 0.70),
    "abps-div": _preset("abps-div", "ABPS+P+Q+kappa=1 with the diversity goal (Table 1, Sec. 6.5).",
                        {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "diversity"}},
                        "ABPS+P+Q+κ=1 (div.)", "goal", 16, 0.60),
    "abps-align": _preset("abps-align", "ABPS+P+Q+kappa=1 with the alignment goal (Table 1, Sec. 6.5).",
                          {"exchange": dict(_PQ), "params": {**_GOAL_PARAMS, "goal": "alignment"}},
                          "ABPS+P+Q+κ=1 (align.)", "goal", 17, 0.70),
    "abps-drift": _preset("abps-drift", "Base ABPS with the online Welch-t drift windows (abps.drift; Sec. 7 iii).",
                          {"params": {"drift_window": 4, "drift_alpha": 0.01}}, "ABPS + drift windows", "abps", None, 0.90),
    "abps-x": _preset(
        "abps-x",
        "ABPS-X (Sec. 6.4): 2-layer head, bf16, kappa 1, server EMA beta 0.5, 15-dim metadata, homogeneity, "
        "val-AUROC early stopping (patience 10 of at most 100 rounds).",
        {
            "exchange": {"head_layers": 2, "bf16_wire": True, "server_momentum": 0.5},
            "early_stopping": {"enabled": True, "patience": 10, "max_rounds": 100},
            "params": {**_GOAL_PARAMS, "goal": "homogeneity"},
        },
        "ABPS-X (ours, full)", "abps-x", 18, 0.70,
    ),
}
