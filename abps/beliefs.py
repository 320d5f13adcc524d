"""Beta-Bernoulli beliefs over peers' marginal utility and their UCB ranking score.

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["BetaBeliefs", "ucb_bonus", "max_resting_gamma"]


def ucb_bonus(t: int, pulls: Tensor | float, gamma: float) -> Tensor:
    """Exploration bonus of eq. (7): ``gamma * sqrt(2 ln t / (n + 1))``.

    Args:
        t: round index, ``t >= 1`` (1-based; the bonus is 0 at ``t = 1``).
        pulls: ``n_{i->j}``, a tensor of any shape or a float (>= 0).
        gamma: exploration weight, ``>= 0``.
    Returns:
        float64 tensor shaped like ``pulls``.
    Raises:
        ValueError: ``t < 1`` or ``gamma < 0``.
    """
    if t < 1:
        raise ValueError(f"round index t must be >= 1, got {t}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    n = torch.as_tensor(pulls, dtype=torch.float64)
    return gamma * torch.sqrt(2.0 * math.log(t) / (n + 1.0))


def max_resting_gamma(mu: float, t: int, pulls: float, tau_acc: float = 0.5) -> float:
    """Largest gamma for which a peer with posterior mean ``mu`` after ``pulls`` observations scores
    ``UCB < tau_acc`` at round ``t`` (eq. 7), i.e. can be refused under the rest rule of Lemma 1.

    ``mu + gamma sqrt(2 ln t / (n + 1)) < tau_acc  <=>  gamma < (tau_acc - mu) / sqrt(2 ln t / (n + 1))``.
    At ``t = 1`` the bonus is 0, so any gamma works when ``mu < tau_acc`` (returns ``inf``).

    Returns:
        The supremum (strict bound); 0 when ``mu >= tau_acc`` (no gamma makes the UCB fall below).
    Raises:
        ValueError: ``t < 1`` or ``pulls < 0``.
    """
    if pulls < 0:
        raise ValueError(f"pulls must be >= 0, got {pulls}")
    if mu >= tau_acc:
        return 0.0
    radius = float(ucb_bonus(t, pulls, 1.0))
    return math.inf if radius == 0.0 else (tau_acc - mu) / radius


@dataclass
class BetaBeliefs:
    """Beta(alpha, beta) beliefs of every center about every other center (ABPS Sec. 4.2).

    Attributes:
        alpha: ``[n, n]`` float64, ``alpha[i, j] = alpha_{i->j}`` (pseudo-count of utility mass).
        beta: ``[n, n]`` float64, ``beta[i, j] = beta_{i->j}``.
        pulls: ``[n, n]`` float64, ``n_{i->j}``: number of observations (eq. 7), fractional after decay.
        alpha0, beta0: the Beta prior (Algorithm 1 line 5; the paper uses (1, 1)).
    """

    alpha: Tensor
    beta: Tensor
    pulls: Tensor
    alpha0: float = 1.0
    beta0: float = 1.0

    @classmethod
    def prior(cls, n: int, alpha0: float = 1.0, beta0: float = 1.0) -> BetaBeliefs:
        """Fresh beliefs for ``n`` centers, all at Beta(alpha0, beta0) with zero pulls.

        Raises:
            ValueError: ``n < 1`` or a non-positive prior parameter.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not (alpha0 > 0 and beta0 > 0):
            raise ValueError(f"Beta prior must be positive, got ({alpha0}, {beta0})")
        full = lambda v: torch.full((n, n), float(v), dtype=torch.float64)  # noqa: E731
        return cls(full(alpha0), full(beta0), torch.zeros(n, n, dtype=torch.float64), float(alpha0), float(beta0))

    @property
    def n(self) -> int:
        """Number of centers."""
        return int(self.alpha.shape[0])

    def mean(self) -> Tensor:
        """Posterior mean ``mu_hat[i, j] = alpha / (alpha + beta)``, ``[n, n]`` float64 in (0, 1)."""
        return self.alpha / (self.alpha + self.beta)

    def variance(self) -> Tensor:
        """Posterior variance ``alpha beta / ((alpha + beta)^2 (alpha + beta + 1))``, ``[n, n]`` (Sec. 4.2)."""
        s = self.alpha + self.beta
        return self.alpha * self.beta / (s * s * (s + 1.0))

    def ucb(self, t: int, gamma: float) -> Tensor:
        """UCB score of eq. (7) at round ``t`` (1-based): ``mu_hat + gamma sqrt(2 log t / (n + 1))``.

        ``ucb[i, j]`` is the paper's ``UCB_{j->i}(t)``: center ``i``'s optimistic estimate of peer ``j``.
        At ``t = 1`` the bonus is 0, so a fresh prior Beta(1, 1) scores exactly 0.5.

        Args:
            t: round index, ``t >= 1``.
            gamma: exploration weight, ``gamma >= 0``.
        Returns:
            ``[n, n]`` float64 (may exceed 1; the diagonal is meaningless).
        Raises:
            ValueError: ``t < 1`` or ``gamma < 0``.
        """
        return self.mean() + ucb_bonus(t, self.pulls, gamma)

    def update(self, phi_bar: Tensor, observed: Tensor) -> None:
        """Conjugate update of eq. (6) for the observed ordered pairs, in place.

        Args:
            phi_bar: ``[n, n]`` clipped Shapley utilities (eq. 5); ``phi_bar[i, j]`` is what ``i``
                observed about partner ``j``. Entries where ``observed`` is False are ignored (may be NaN).
            observed: ``[n, n]`` bool, True where ``j`` was in ``P_i`` this round.
        Raises:
            ValueError: shape mismatch, or an observed value outside [0, 1] or not finite (the affine
                clip of eq. 5 must be applied first; Assumption A1).
        """
        n = self.n
        if tuple(phi_bar.shape) != (n, n) or tuple(observed.shape) != (n, n):
            raise ValueError(f"phi_bar and observed must be [{n}, {n}], got {tuple(phi_bar.shape)}, {tuple(observed.shape)}")
        obs = observed.to(torch.bool)
        vals = phi_bar.to(torch.float64)
        sel = vals[obs]
        if sel.numel() and (not torch.isfinite(sel).all() or sel.min() < 0.0 or sel.max() > 1.0):
            raise ValueError("observed phi_bar must be finite and in [0, 1] (apply the clip of eq. 5 first)")
        x = torch.where(obs, vals, torch.zeros((), dtype=torch.float64))
        m = obs.to(torch.float64)
        self.alpha += x
        self.beta += m - x
        self.pulls += m

    def decay(self, rho: float) -> None:
        """Forget toward the prior between rounds (drift, Sec. 3), in place.

        ``alpha <- alpha0 + rho (alpha - alpha0)``, ``beta <- beta0 + rho (beta - beta0)``,
        ``pulls <- rho * pulls``. ``rho = 1`` leaves the beliefs unchanged; ``rho = 0`` resets to the prior.

        Raises:
            ValueError: ``rho`` outside [0, 1].
        """
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"belief decay rho must be in [0, 1], got {rho}")
        if rho == 1.0:
            return
        self.alpha.sub_(self.alpha0).mul_(rho).add_(self.alpha0)
        self.beta.sub_(self.beta0).mul_(rho).add_(self.beta0)
        self.pulls.mul_(rho)

    def summary(self) -> dict[str, Tensor]:
        """Per-center summaries over its off-diagonal beliefs, each ``[n]`` float64.

        Keys: ``mean_belief`` (average posterior mean over peers), ``max_belief``, ``best_peer``
        (column index of the highest posterior mean), ``pulls`` (total observations made),
        ``n_peers_observed`` (peers with at least one observation).
        """
        n = self.n
        off = ~torch.eye(n, dtype=torch.bool)
        mu = self.mean()
        mu_off = torch.where(off, mu, torch.full_like(mu, float("nan")))
        if n > 1:
            mean_b = torch.nanmean(mu_off, dim=1)
            max_b, best = torch.where(off, mu, torch.full_like(mu, -1.0)).max(dim=1)
        else:
            mean_b = torch.full((n,), float("nan"), dtype=torch.float64)
            max_b = mean_b.clone()
            best = torch.full((n,), -1, dtype=torch.long)
        p = torch.where(off, self.pulls, torch.zeros_like(self.pulls))
        return {
            "mean_belief": mean_b,
            "max_belief": max_b,
            "best_peer": best.to(torch.float64),
            "pulls": p.sum(dim=1),
            "n_peers_observed": (p > 0).sum(dim=1).to(torch.float64),
        }
