"""Online Welch-t drift windows on the peers' utility observations (ABPS paper Sec. 3, Sec. 7 item iii).

The paper bounds drift inside windows ``Delta t_m`` (assumption A3) and suggests an online Welch
t-test to place the window boundaries (Sec. 3, the note below Figure 1: expand the window while
``|mu_t - mu_{t+k}| / sqrt(s_t^2 / N_t + s_{t+k}^2 / N_{t+k})`` stays below ``t_crit`` at
alpha = 0.05), leaving that estimator to future work (Sec. 7, item iii). This module is the online
test on what ABPS actually observes: for every believer ``i`` and peer ``j`` it keeps the last ``2w``
clipped Shapley utilities ``phi_bar_{j->i}`` (eq. 5) in one stacked ring buffer ``[n, n, 2w]``. After
each round, every pair that made a new observation and holds ``2w`` of them tests its latest ``w``
observations against the ``w`` before with Welch's unequal-variance t-test
(:func:`scipy.stats.ttest_ind` with ``equal_var=False``, vectorized over all ready pairs). A p-value
below ``alpha`` is a detected change of ``j``'s utility to ``i``.

On a detection the believer restarts its Beta belief about that peer from the change point
(:func:`restart_beliefs`): the prior, plus ``rho`` times the evidence from before the latest window
(``rho = 0``: forgotten), plus the latest window's ``w`` observations (the evidence after the change),
and the pair's buffer is emptied so that the next test compares two post-change windows. This is the
restart rule of change-detection bandits (e.g. CUSUM-UCB, M-UCB) applied per pair. The method also
re-sends a flagged peer's metadata vector when it changed (:mod:`abps.privacy` counts the release).

Default off (``drift_window = 0``); the ``abps-drift`` preset turns it on.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from pydantic import BaseModel, Field, model_validator
from scipy import stats
from torch import Tensor

from abps.beliefs import BetaBeliefs
from abps.privacy import MetadataRelease
from abps.goal_filter import candidate_mask

__all__ = ["DriftParams", "WelchWindows", "DriftMonitor", "welch_pvalues", "restart_beliefs"]


class DriftParams(BaseModel):
    """Method parameters of the drift windows (ABPS config ``params:``; mixed into AbpsParams).

    Attributes:
        drift_window: ``w``, observations per window (0 = off; the test needs ``w >= 2``).
        drift_alpha: level of the Welch t-test (two-sided).
        drift_rho: weight kept of a restarted pair's evidence from before the latest window (0 = reset).
    """

    drift_window: int = Field(0, ge=0)
    drift_alpha: float = Field(0.01, gt=0.0, lt=1.0)
    drift_rho: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _window(self) -> "DriftParams":
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

    def __init__(self, n: int, window: int) -> None:
        if window < 2:
            raise ValueError(f"drift window must be >= 2, got {window}")
        self.w = int(window)
        self.buf = torch.zeros(n, n, 2 * self.w, dtype=torch.float64)
        self.count = torch.zeros(n, n, dtype=torch.long)

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

    def test(self, observed: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
        """Welch test of the latest window against the previous one for the pairs observed this round.

        Returns:
            ``(detected, pvalue)``: ``[n, n]`` bool and ``[n, n]`` float64 (NaN where not tested).
        """
        ready = observed.to(torch.bool) & (self.count >= 2 * self.w)
        pv = torch.full(self.count.shape, float("nan"), dtype=torch.float64)
        if ready.any():
            seq = self.ordered()[ready]
            pv[ready] = welch_pvalues(seq[:, : self.w], seq[:, self.w:])
        return ready & (pv < alpha), pv

    def latest(self) -> Tensor:
        """``[n, n, w]`` the latest ``w`` observations in time order (meaningful where ``count >= w``)."""
        return self.ordered()[..., self.w:]

    def clear(self, mask: Tensor) -> None:
        """Empty the buffers of the pairs in ``mask`` (``[n, n]`` bool)."""
        self.count = torch.where(mask, torch.zeros_like(self.count), self.count)


def restart_beliefs(beliefs: BetaBeliefs, mask: Tensor, latest: Tensor, rho: float) -> None:
    """Restart the Beta beliefs of the pairs in ``mask`` from the change point, in place.

    With ``s`` the sum and ``w`` the length of the latest window: the evidence before the window,
    ``E_a = max(alpha - alpha0 - s, 0)``, ``E_b = max(beta - beta0 - (w - s), 0)``,
    ``E_n = max(n - w, 0)``, is kept with weight ``rho``:
    ``alpha = alpha0 + rho E_a + s``, ``beta = beta0 + rho E_b + w - s``, ``n = rho E_n + w``.

    Args:
        beliefs: the run's beliefs ``[n, n]``.
        mask: ``[n, n]`` bool pairs to restart.
        latest: ``[n, n, w]`` the latest window of observations (phi_bar in [0, 1]).
        rho: in [0, 1].
    Raises:
        ValueError: rho outside [0, 1].
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"drift_rho must be in [0, 1], got {rho}")
    w = float(latest.shape[-1])
    s = latest.sum(dim=-1)
    ea = (beliefs.alpha - beliefs.alpha0 - s).clamp(min=0.0)
    eb = (beliefs.beta - beliefs.beta0 - (w - s)).clamp(min=0.0)
    en = (beliefs.pulls - w).clamp(min=0.0)
    beliefs.alpha.copy_(torch.where(mask, beliefs.alpha0 + rho * ea + s, beliefs.alpha))
    beliefs.beta.copy_(torch.where(mask, beliefs.beta0 + rho * eb + (w - s), beliefs.beta))
    beliefs.pulls.copy_(torch.where(mask, rho * en + w, beliefs.pulls))


class DriftMonitor:
    """The drift windows of one run: push, test, restart (one call per round).

    Args:
        params: any model with the :class:`DriftParams` fields (``drift_window >= 2``).
        n: number of centers.
    """

    def __init__(self, params: DriftParams, n: int) -> None:
        self.alpha = float(params.drift_alpha)
        self.rho = float(params.drift_rho)
        self.windows = WelchWindows(n, params.drift_window)
        self.detections = torch.zeros(n, n, dtype=torch.long)  # [n, n] detections per pair
        self.tested = torch.zeros(n, n, dtype=torch.long)  # [n, n] tests per pair
        self.tests = 0

    def step(self, beliefs: BetaBeliefs, phi_bar: Tensor, observed: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Record this round's observations, test, restart the beliefs of the changed pairs.

        Args:
            beliefs: updated with this round's observations already (eq. 6).
            phi_bar: ``[n, n]`` clipped utilities; observed: ``[n, n]`` bool.
        Returns:
            ``(flagged, metrics)``: ``flagged`` ``[n]`` bool, peers some believer detected a change of;
            metrics ``drift_tests`` (pairs tested this round) and ``drift_detections``.
        """
        self.windows.push(phi_bar, observed)
        detected, pv = self.windows.test(observed, self.alpha)
        ran = torch.isfinite(pv)
        tested = int(ran.sum())
        self.tests += tested
        self.tested += ran.to(torch.long)
        if detected.any():
            restart_beliefs(beliefs, detected, self.windows.latest(), self.rho)
            self.windows.clear(detected)
            self.detections += detected.to(torch.long)
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
        """First release of every center's v_i (Algorithm 1 line 10); sets up the drift windows.

        Returns:
            ``[n, d]`` the metadata the federation holds (``meta`` itself when DP is off or no goal).
        """

        p = self.p
        self.metadata_release = MetadataRelease(p, ctx.n_train, ctx.seed)
        window = getattr(p, "drift_window", 0)  # random-partners has no beliefs and no drift windows
        self.drift = DriftMonitor(p, ctx.n) if window else None
        self._resend = 0
        return self.metadata_release.release(meta) if p.goal is not None else meta

    def _current_metadata(self, ctx) -> Tensor:
        return ctx.meta if self.meta_dim == 15 else ctx.meta_base

    def _drift_step(self, ctx, phi_bar: Tensor, observed: Tensor) -> dict[str, float]:
        """Drift windows after the Beta update; re-send the flagged peers' changed metadata.

        Returns:
            extra round metrics: ``drift_tests``, ``drift_detections``, ``metadata_resent`` (drift on);
            ``dp_epsilon_spent`` (DP on, with a goal).
        """

        p = self.p
        out: dict[str, float] = {}
        rel = self.metadata_release
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
        return out

    def _take_resend_bytes(self) -> int:
        """Metadata bytes re-sent since the last call (booked in the next round's ledger record)."""
        b, self._resend = self._resend, 0
        return b

    def _privacy_drift_metrics(self) -> dict[str, float]:
        """Privacy spent and drift totals for results.json and the final MLflow metrics.

        Keys (only for what is on): :meth:`abps.privacy.MetadataRelease.spent` when a goal makes the
        centers release metadata; ``drift_tests_total``, ``drift_detections_total`` with drift windows.
        """
        out: dict[str, float] = {}
        if self.p.goal is not None:
            out.update(self.metadata_release.spent())
        if self.drift is not None:
            out["drift_tests_total"] = float(self.drift.tests)
            out["drift_detections_total"] = float(self.drift.detections.sum())
        return out
