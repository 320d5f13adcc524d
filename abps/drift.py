"""Online Welch-t drift windows on the peers' utility observations (ABPS paper Sec. 3, Sec. 7 item iii).

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from scipy import stats
from torch import Tensor

from abps.beliefs import BetaBeliefs
from abps.goal_filter import candidate_mask
from abps.privacy import MetadataRelease
from federation.core.config import NumbersNotFlags
from federation.data.drift_scenario import drift_centers

__all__ = ["DriftParams", "WelchWindows", "DriftMonitor", "welch_pvalues", "restart_beliefs", "rounds_until_zero",
           "candidate_overlap"]


class DriftParams(NumbersNotFlags):
    """Method parameters of the drift windows (ABPS config ``params:``; mixed into AbpsParams).

    Attributes:
        drift_window: ``w``, observations per window (0 = off; the test needs ``w >= 2``).
        drift_alpha: level of the Welch t-test (two-sided).
        drift_rho: weight kept of a restarted pair's evidence from before the latest window (0 = reset;
            ``drift_reset: window`` only).
        drift_scope: ``pair`` (each believer tests its own observations of each peer: a pair fills its
            ``2w`` observations only as often as it partners) or ``peer`` (one pooled stream per peer: each
            round, the mean phi_bar the peer brought to the believers that observed it; a detection
            restarts every believer's belief about that peer with the pooled latest window).
        drift_direction: ``both`` (a significant change either way is a detection) or ``drop`` (only a
            significant fall of the mean utility: the change that can make a partner harmful).
        drift_reset: what a detected change does to the pair's Beta belief (:func:`restart_beliefs`):
            ``window`` restarts it from the change point (prior + latest window: the pull count falls to
            ``w``, so the UCB radius of eq. 7 widens again); ``level`` moves its mean to the latest
            window's mean and keeps its pull count (the radius stays where the evidence put it).
    """

    drift_window: int = Field(0, ge=0)
    drift_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    drift_rho: float = Field(0.0, ge=0.0, le=1.0)
    drift_reset: Literal["window", "level"] = "window"
    drift_scope: Literal["pair", "peer"] = "pair"
    drift_direction: Literal["both", "drop"] = "both"

    @model_validator(mode="after")
    def _window(self) -> DriftParams:
        if self.drift_window == 1:
            raise ValueError("drift_window must be 0 (off) or >= 2 (a variance needs two observations)")
        return self


def welch_pvalues(old: Tensor, new: Tensor) -> Tensor:
    """Two-sided p-values of Welch's t-test, ``old`` against ``new``, along the last axis.

    Args:
        old, new: ``[..., w]`` samples (w >= 2).
    Returns:
        ``[...]`` float64 p-values from :func:`scipy.stats.ttest_ind` (``equal_var=False``). Where both
        windows have zero variance the statistic is undefined; the p-value is then 0 when the means
        differ (a certain change) and 1 when they are equal.
    """
    a, b = old.to(torch.float64).numpy(), new.to(torch.float64).numpy()
    if a.size == 0:
        return torch.zeros(a.shape[:-1], dtype=torch.float64)
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # constant windows: handled below
        p = stats.ttest_ind(a, b, equal_var=False, axis=-1).pvalue
    p = np.asarray(p, dtype=np.float64)
    flat = (a.var(axis=-1) == 0) & (b.var(axis=-1) == 0)
    p = np.where(flat, np.where(a.mean(axis=-1) != b.mean(axis=-1), 0.0, 1.0), p)
    return torch.from_numpy(np.nan_to_num(p, nan=1.0))


class WelchWindows:
    """Per-(believer, peer) ring buffer of the last ``2w`` utility observations, stacked ``[n, n, 2w]``.

    Attributes:
        buf: ``[n, n, 2w]`` float64 observations; slot ``count % 2w`` is written next.
        count: ``[n, n]`` int64 observations since the pair's last restart.
    """

    #: instances may be rebuilt from a round checkpoint (federation.run.checkpoint.read)
    __checkpoint_state__ = True

    def __init__(self, n: int, window: int, rows: int | None = None) -> None:
        if window < 2:
            raise ValueError(f"drift window must be >= 2, got {window}")
        self.w = int(window)
        r = n if rows is None else int(rows)  # rows = 1: one pooled stream per peer (drift_scope: peer)
        self.buf = torch.zeros(r, n, 2 * self.w, dtype=torch.float64)
        self.count = torch.zeros(r, n, dtype=torch.long)

    def push(self, values: Tensor, observed: Tensor) -> None:
        """Append ``values[i, j]`` for every observed pair (one scatter, no loop over centers).

        Args:
            values: ``[n, n]`` phi_bar; ignored (may be NaN) where ``observed`` is False.
            observed: ``[n, n]`` bool.
        """
        obs = observed.to(torch.bool)
        slot = (self.count % (2 * self.w)).unsqueeze(-1)
        cur = self.buf.gather(-1, slot).squeeze(-1)
        new = torch.where(obs, values.to(torch.float64), cur)
        self.buf.scatter_(-1, slot, new.unsqueeze(-1))
        self.count += obs.to(torch.long)

    def ordered(self) -> Tensor:
        """``[n, n, 2w]`` the buffer in time order (oldest first) for pairs with ``count >= 2w``."""
        k = 2 * self.w
        idx = (self.count.unsqueeze(-1) + torch.arange(k)) % k
        return self.buf.gather(-1, idx)

    def test(self, observed: Tensor, alpha: float, drop_only: bool = False) -> tuple[Tensor, Tensor]:
        """Welch test of the latest window against the previous one for the pairs observed this round.

        Args:
            observed: ``[r, n]`` bool, the streams that received an observation this round.
            alpha: two-sided level.
            drop_only: count a significant change only when the latest window's mean is the lower.
        Returns:
            ``(detected, pvalue)``: ``[r, n]`` bool and ``[r, n]`` float64 (NaN where not tested).
        """
        ready = observed.to(torch.bool) & (self.count >= 2 * self.w)
        pv = torch.full(self.count.shape, float("nan"), dtype=torch.float64)
        detected = torch.zeros_like(ready)
        if ready.any():
            seq = self.ordered()[ready]
            pv[ready] = welch_pvalues(seq[:, : self.w], seq[:, self.w:])
            hit = pv[ready] < alpha
            if drop_only:
                hit &= seq[:, self.w:].mean(dim=-1) < seq[:, : self.w].mean(dim=-1)
            detected[ready] = hit
        return detected, pv

    def latest(self) -> Tensor:
        """``[n, n, w]`` the latest ``w`` observations in time order (meaningful where ``count >= w``)."""
        return self.ordered()[..., self.w:]

    def clear(self, mask: Tensor) -> None:
        """Empty the buffers of the pairs in ``mask`` (``[n, n]`` bool)."""
        self.count = torch.where(mask, torch.zeros_like(self.count), self.count)


def restart_beliefs(beliefs: BetaBeliefs, mask: Tensor, latest: Tensor, rho: float, mode: str = "window") -> None:
    """Restart the Beta beliefs of the pairs in ``mask`` from the change point, in place.

    With ``s`` the sum and ``w`` the length of the latest window:

    * ``mode = "window"``: the evidence before the window, ``E_a = max(alpha - alpha0 - s, 0)``,
      ``E_b = max(beta - beta0 - (w - s), 0)``, ``E_n = max(n - w, 0)``, is kept with weight ``rho``:
      ``alpha = alpha0 + rho E_a + s``, ``beta = beta0 + rho E_b + w - s``, ``n = rho E_n + w``
      (the paper's "posterior decays toward the prior", Sec. 3, at the detected break).
    * ``mode = "level"``: the pair keeps its pull count ``n`` and its mean moves to the window's
      ``s / w``: ``alpha = alpha0 + n s / w``, ``beta = beta0 + n (1 - s / w)``. The UCB of eq. (7)
      then drops by the whole detected change at once instead of gaining the exploration radius of a
      fresh pair (docs/privacy.md, "Why nobody stopped partnering").

    Args:
        beliefs: the run's beliefs ``[n, n]``.
        mask: ``[n, n]`` bool pairs to restart.
        latest: ``[n, n, w]`` the latest window of observations (phi_bar in [0, 1]).
        rho: in [0, 1] (``window`` only).
        mode: ``window`` or ``level``.
    Raises:
        ValueError: rho outside [0, 1], or an unknown mode.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"drift_rho must be in [0, 1], got {rho}")
    if mode not in ("window", "level"):
        raise ValueError(f"drift_reset must be 'window' or 'level', got {mode!r}")
    w = float(latest.shape[-1])
    s = latest.sum(dim=-1)
    if mode == "level":
        n = beliefs.pulls
        new_a, new_b, new_n = beliefs.alpha0 + n * s / w, beliefs.beta0 + n * (1.0 - s / w), n
    else:
        ea = (beliefs.alpha - beliefs.alpha0 - s).clamp(min=0.0)
        eb = (beliefs.beta - beliefs.beta0 - (w - s)).clamp(min=0.0)
        en = (beliefs.pulls - w).clamp(min=0.0)
        new_a, new_b, new_n = beliefs.alpha0 + rho * ea + s, beliefs.beta0 + rho * eb + (w - s), rho * en + w
    beliefs.alpha.copy_(torch.where(mask, new_a, beliefs.alpha))
    beliefs.beta.copy_(torch.where(mask, new_b, beliefs.beta))
    beliefs.pulls.copy_(torch.where(mask, new_n, beliefs.pulls))


def rounds_until_zero(counts: list[float], start: int, hold: int = 3) -> int | None:
    """Rounds from ``start`` until ``counts`` is 0 for ``hold`` rounds running.

    Args:
        counts: per-round values, index 0 = round 1.
        start: 1-based round from which to look (the drift scenario's flip round).
        hold: rounds the value must stay 0.
    Returns:
        ``r - start`` for the first 1-based round ``r >= start`` opening such a run of zeros that fits
        in ``counts``; None when there is none.
    """
    for k in range(max(start - 1, 0), len(counts) - hold + 1):
        if all(c == 0 for c in counts[k:k + hold]):
            return k + 1 - start
    return None


def candidate_overlap(exact: Tensor, noisy: Tensor) -> dict[str, float]:
    """Overlap of candidate sets from released metadata with those from the exact metadata.

    Args:
        exact, noisy: ``[n, n]`` bool candidate masks (:func:`abps.goal_filter.candidate_mask`).
    Returns:
        ``candidate_kept_share`` (exact pairs still candidates, / exact pairs; 1 when there is none)
        and ``candidate_jaccard`` (intersection / union; 1 when both are empty).
    """
    inter = float((exact & noisy).sum())
    n_exact, union = float(exact.sum()), float((exact | noisy).sum())
    return {"candidate_kept_share": inter / n_exact if n_exact else 1.0,
            "candidate_jaccard": inter / union if union else 1.0}


class DriftMonitor:
    """The drift windows of one run: push, test, restart (one call per round).

    Args:
        params: any model with the :class:`DriftParams` fields (``drift_window >= 2``).
        n: number of centers.
    """

    #: instances may be rebuilt from a round checkpoint (federation.run.checkpoint.read)
    __checkpoint_state__ = True

    def __init__(self, params: DriftParams, n: int) -> None:
        self.alpha = float(params.drift_alpha)
        self.rho = float(params.drift_rho)
        self.mode = str(getattr(params, "drift_reset", "window"))
        self.scope = str(getattr(params, "drift_scope", "pair"))
        self.drop_only = str(getattr(params, "drift_direction", "both")) == "drop"
        self.windows = WelchWindows(n, params.drift_window, 1 if self.scope == "peer" else None)
        self.detections = torch.zeros(n, n, dtype=torch.long)  # [n, n] detections per pair
        self.tested = torch.zeros(n, n, dtype=torch.long)  # [n, n] tests per pair
        self.tests = 0
        self.last_detected = torch.zeros(n, n, dtype=torch.bool)  # [n, n] this round's detections
        self.last_tested = torch.zeros(n, n, dtype=torch.bool)  # [n, n] this round's tests

    def step(self, beliefs: BetaBeliefs, phi_bar: Tensor, observed: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Record this round's observations, test, restart the beliefs of the changed pairs.

        Args:
            beliefs: updated with this round's observations already (eq. 6).
            phi_bar: ``[n, n]`` clipped utilities; observed: ``[n, n]`` bool.
        Returns:
            ``(flagged, metrics)``: ``flagged`` ``[n]`` bool, peers some believer detected a change of;
            metrics ``drift_tests`` (pairs, or peers with ``drift_scope: peer``, tested this round) and
            ``drift_detections`` (pairs restarted).
        """
        obs = observed.to(torch.bool)
        if self.scope == "peer":  # one pooled observation per observed peer: [1, n]
            seen = obs.any(dim=0)
            pooled = torch.where(obs, phi_bar.to(torch.float64), 0.0).sum(dim=0) / obs.sum(dim=0).clamp(min=1)
            self.windows.push(pooled[None], seen[None])
            det, pv = self.windows.test(seen[None], self.alpha, self.drop_only)
            tested = int(torch.isfinite(pv).sum())
            off = ~torch.eye(obs.shape[0], dtype=torch.bool)
            detected, ran = det.expand_as(obs) & off, torch.isfinite(pv).expand_as(obs) & off
            latest = self.windows.latest().expand(*obs.shape, self.windows.w)
        else:
            self.windows.push(phi_bar, obs)
            det, pv = self.windows.test(obs, self.alpha, self.drop_only)
            ran = torch.isfinite(pv)
            detected, tested = det, int(ran.sum())
            latest = self.windows.latest()
        self.tests += tested
        self.tested += ran.to(torch.long)
        if detected.any():
            restart_beliefs(beliefs, detected, latest, self.rho, self.mode)
            self.windows.clear(det)
            self.detections += detected.to(torch.long)
        self.last_detected, self.last_tested = detected, ran
        return detected.any(dim=0), {"drift_tests": float(tested), "drift_detections": float(detected.sum())}


class PrivacyDriftHooks:
    """Mixin of :class:`abps.method.AbpsMethod`: the DP metadata release and the drift windows.

    The method calls :meth:`_publish_metadata` once in ``setup`` (the first release, at filter time),
    :meth:`_drift_step` in ``after_exchange`` after the Beta update, and adds
    :meth:`_take_resend_bytes` to the round's metadata bytes, and merges :meth:`_privacy_drift_metrics`
    into its ``final_metrics``. Expects ``self.p`` (AbpsParams, with the
    :class:`abps.privacy.MetadataDpParams` and :class:`DriftParams` fields), ``self.beliefs``,
    ``self.candidates`` / ``self.tau_sim`` and ``self.meta_dim``.
    """

    def _publish_metadata(self, ctx, meta: Tensor) -> Tensor:
        """First release of every center's v_i (Algorithm 1 line 10); sets up the drift windows and,
        under a drift scenario (run config ``drift:``), the bookkeeping of :meth:`_scenario_metrics`.

        Returns:
            ``[n, d]`` the metadata the federation holds (``meta`` itself when DP is off or no goal).
        """

        p = self.p
        self.metadata_release = MetadataRelease(p, ctx.n_train, ctx.seed)
        window = getattr(p, "drift_window", 0)  # random-partners has no beliefs and no drift windows
        self.drift = DriftMonitor(p, ctx.n) if window else None
        self._resend = 0
        self._round = 0
        scenario = getattr(ctx.cfg, "drift", None)
        # the flipped centers are known to the simulation only: used for metrics, never for decisions
        self._flipped = drift_centers(ctx.data, scenario) if scenario is not None else None
        self._flip_round = int(scenario.round) if scenario is not None else 0
        self._scenario_log: dict[str, list[float]] = {}
        self._overlap: dict[str, float] = {}
        if p.goal is None:
            return meta
        published = self.metadata_release.release(meta)
        if self.metadata_release.enabled:  # what the noise did to the candidate sets (exact sets: same call)
            args = (p.goal, p.keep_fraction, p.normalize_metadata, p.tau_mode, p.candidacy)
            self._overlap = candidate_overlap(candidate_mask(meta.double(), *args)[0],
                                              candidate_mask(published.double(), *args)[0])
        else:
            self._overlap = {"candidate_kept_share": 1.0, "candidate_jaccard": 1.0}
        return published

    def _current_metadata(self, ctx) -> Tensor:
        return ctx.meta if self.meta_dim == 15 else ctx.meta_base

    def _drift_step(self, ctx, phi_bar: Tensor, observed: Tensor) -> dict[str, float]:
        """Drift windows after the Beta update; re-send the flagged peers' changed metadata.

        Returns:
            extra round metrics: ``drift_tests``, ``drift_detections``, ``metadata_resent`` (drift on);
            ``dp_epsilon_spent`` (DP on, with a goal); under a drift scenario those of
            :meth:`_scenario_metrics`.
        """

        p = self.p
        out: dict[str, float] = {}
        rel = self.metadata_release
        self._round += 1
        if self.drift is not None:
            flagged, out = self.drift.step(self.beliefs, phi_bar, observed)
            resend = torch.zeros_like(flagged)
            if p.goal is not None:
                meta = self._current_metadata(ctx)
                resend = flagged & rel.changed(meta)
                if resend.any():
                    published = rel.release(meta, resend)
                    self.candidates, self.tau_sim = candidate_mask(
                        published.double(), p.goal, p.keep_fraction, p.normalize_metadata, p.tau_mode, p.candidacy)
                    self._resend += int(resend.sum()) * self.meta_dim * 4  # float32 on the wire
            out["metadata_resent"] = float(resend.sum())
        if rel.enabled and p.goal is not None:
            out["dp_epsilon_spent"] = rel.spent()["dp_epsilon_spent"]
        if self._flipped is not None:
            out.update(self._scenario_metrics())
        return out

    def _scenario_metrics(self) -> dict[str, float]:
        """Per-round measurements of the drift study (run config ``drift:``; docs/privacy.md sec. 4.2).

        With ``F`` the flipped centers and ``H`` the others, after this round's update:
        ``flipped_mixed_edges`` / ``flipped_mixed_share`` (partnerships with exactly one end in ``F``:
        the harmful ones; two flipped centers help each other), ``flipped_belief_mean`` and
        ``flipped_ucb_mean`` (mean posterior mean and next-round UCB of eq. 7 of ``H`` about ``F``),
        ``flipped_accept_share`` (share of those pairs with UCB >= tau_acc: a receiver in ``H`` would
        accept the flipped proposer); with drift windows ``drift_detections_flipped`` (``H`` believer,
        ``F`` peer), ``drift_false_alarms`` and ``drift_tests_unaffected`` (pairs with neither end in ``F``).
        """
        p, f = self.p, self._flipped
        upper = torch.triu(self.last.partners, 1)
        mixed = upper & (f[:, None] ^ f[None, :])
        edges = float(upper.sum())
        hf = ~f[:, None] & f[None, :]
        out = {"flipped_mixed_edges": float(mixed.sum()),
               "flipped_mixed_share": float(mixed.sum()) / edges if edges else 0.0}
        if hf.any():
            ucb = self.beliefs.ucb(self._round + 1, p.gamma)[hf]
            out["flipped_belief_mean"] = float(self.beliefs.mean()[hf].mean())
            out["flipped_ucb_mean"] = float(ucb.mean())
            out["flipped_accept_share"] = float((ucb >= p.tau_acc).to(torch.float64).mean())
        if self.drift is not None:
            unaffected = ~f[:, None] & ~f[None, :]
            det, ran = self.drift.last_detected, self.drift.last_tested
            out["drift_detections_flipped"] = float((det & hf).sum())
            out["drift_false_alarms"] = float((det & unaffected).sum())
            out["drift_tests_unaffected"] = float((ran & unaffected).sum())
        for k, v in out.items():
            self._scenario_log.setdefault(k, []).append(v)
        return out

    def _scenario_summary(self) -> dict[str, float]:
        """Run totals of the drift study (final metrics; NaN-free keys only where defined).

        ``flip_round``; ``stopped_partnering`` (1 when the mixed partnerships fell to 0 for 3 rounds
        running after the flip); ``rounds_to_stop_partnering`` (rounds from the flip until then, when it
        happened: :func:`rounds_until_zero`); ``mixed_share_pre`` / ``mixed_share_post`` (mean
        ``flipped_mixed_share`` before the flip / over the second half of the rounds after it);
        ``rounds_after_flip``; with drift windows ``detection_delay`` (rounds from the flip to the
        first detection of a flipped peer by an unflipped center, when one happened),
        ``detections_flipped_total``, ``false_alarm_rate`` (false alarms / tests on unaffected pairs,
        when any ran) and ``false_alarms_total``.
        """
        log, r0 = self._scenario_log, self._flip_round
        edges = log.get("flipped_mixed_edges", [])
        share = log.get("flipped_mixed_share", [])
        pre, post = share[: r0 - 1], share[r0 - 1:]
        stop = rounds_until_zero(edges, r0)
        out: dict[str, float] = {"flip_round": float(r0), "stopped_partnering": float(stop is not None),
                                 "rounds_after_flip": float(len(post))}
        if stop is not None:
            out["rounds_to_stop_partnering"] = float(stop)
        if pre:
            out["mixed_share_pre"] = sum(pre) / len(pre)
        if post:
            tail = post[len(post) // 2:]
            out["mixed_share_post"] = sum(tail) / len(tail)
        if self.drift is not None:
            det = log.get("drift_detections_flipped", [])
            first = next((k for k in range(r0 - 1, len(det)) if det[k] > 0), None)
            if first is not None:
                out["detection_delay"] = float(first + 1 - r0)
            out["detections_flipped_total"] = float(sum(det))
            fa, tests = sum(log.get("drift_false_alarms", [])), sum(log.get("drift_tests_unaffected", []))
            out["false_alarms_total"] = float(fa)
            if tests:
                out["false_alarm_rate"] = fa / tests
        return out

    def _take_resend_bytes(self) -> int:
        """Metadata bytes re-sent since the last call (booked in the next round's ledger record)."""
        b, self._resend = self._resend, 0
        return b

    def _privacy_drift_metrics(self) -> dict[str, float]:
        """Privacy spent and drift totals for results.json and the final MLflow metrics.

        Keys (only for what is on): :meth:`abps.privacy.MetadataRelease.spent` and
        :func:`candidate_overlap` of the first release (1.0 when DP is off) when a goal makes the
        centers release metadata; :meth:`_scenario_summary` under a drift scenario;
        ``drift_tests_total``, ``drift_detections_total`` with drift windows.
        """
        out: dict[str, float] = {}
        if self.p.goal is not None:
            out.update(self.metadata_release.spent())
            out.update(self._overlap)
        if self._flipped is not None and self._scenario_log:
            out.update(self._scenario_summary())
        if self.drift is not None:
            out["drift_tests_total"] = float(self.drift.tests)
            out["drift_detections_total"] = float(self.drift.detections.sum())
        return out
