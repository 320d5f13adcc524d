"""A stationary synthetic partner-selection bandit with known peer utilities (ABPS paper Sec. 5,
App. C): checks ABPS's selection layer (beliefs, UCB, propose-reject with rest) against Theorem 2
and Lemma 1 without training a model. Details: docs/abps.md, "Module notes".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from abps.beliefs import BetaBeliefs
from abps.matching import propose_reject

__all__ = ["StationaryPeerBandit", "BanditTrace", "clustered_utilities", "simulate"]


@dataclass
class StationaryPeerBandit:
    """Known stationary utilities ``mu[i, j] = mu*_{i->j}`` in [0, 1] of peer ``j`` for center ``i``.

    Attributes:
        mu: ``[n, n]`` float64 (diagonal ignored).
        noise: ``"bernoulli"`` or ``"beta"``.
        concentration: ``c`` of the Beta noise (larger = less noise).
    """

    mu: Tensor
    noise: Literal["bernoulli", "beta"] = "beta"
    concentration: float = 10.0

    def __post_init__(self) -> None:
        """Validate ``mu``.

        Raises:
            ValueError: ``mu`` not square or outside (0, 1) off the diagonal, or unknown noise.
        """
        n = self.mu.shape[0]
        if self.mu.ndim != 2 or self.mu.shape[1] != n:
            raise ValueError(f"mu must be [n, n], got {tuple(self.mu.shape)}")
        off = ~torch.eye(n, dtype=torch.bool)
        v = self.mu[off]
        if v.numel() and (v.min() <= 0 or v.max() >= 1):
            raise ValueError("peer utilities mu must lie in (0, 1)")
        if self.noise not in ("bernoulli", "beta"):
            raise ValueError(f"unknown noise {self.noise!r}")
        self.mu = self.mu.to(torch.float64)

    @property
    def n(self) -> int:
        """Number of centers."""
        return int(self.mu.shape[0])

    def sample(self, rng: np.random.Generator) -> Tensor:
        """One observation for every ordered pair, ``[n, n]`` float64 in [0, 1] (caller masks unpulled pairs)."""
        mu = self.mu.numpy().clip(1e-6, 1 - 1e-6)
        if self.noise == "bernoulli":
            x = (rng.random(mu.shape) < mu).astype(np.float64)
        else:
            c = self.concentration
            x = rng.beta(c * mu, c * (1.0 - mu))
        return torch.from_numpy(x)

    def oracle_value(self, kappa: int) -> Tensor:
        """``[n]``: sum of each center's ``kappa`` largest peer utilities (the regret benchmark of Thm. 2)."""
        n = self.n
        mu = self.mu.clone()
        mu.fill_diagonal_(float("-inf"))
        k = min(kappa, n - 1)
        return torch.topk(mu, k, dim=1).values.sum(dim=1)

    def round_regret(self, partners: Tensor, kappa: int) -> Tensor:
        """Per-center regret of one round, ``[n]``: oracle value minus ``sum_{j in P_i} mu*[i, j]``."""
        got = (self.mu * partners.to(torch.float64)).sum(dim=1)
        return self.oracle_value(kappa) - got


@dataclass
class BanditTrace:
    """What :func:`simulate` records.

    Attributes:
        regret: ``[T]`` float64, per-round regret summed over centers.
        isolation: ``[T, n]`` bool, center rested in that round.
        counts: ``[n, n]`` int64, rounds in which ``j`` was in ``P_i``.
        beliefs: the final :class:`BetaBeliefs`.
    """

    regret: Tensor
    isolation: Tensor
    counts: Tensor
    beliefs: BetaBeliefs

    def cumulative_regret(self) -> Tensor:
        """``R(t)`` for ``t = 1..T``, ``[T]``."""
        return torch.cumsum(self.regret, dim=0)


def clustered_utilities(
    n_groups: int, group_size: int, within: float = 0.8, low: float = 0.2, high: float = 0.6, seed: int = 0
) -> Tensor:
    """Utilities with a feasible oracle: centers in the same group of ``group_size`` are each other's
    best peers (``mu = within``); every other pair draws ``mu ~ U(low, high)`` independently per
    ordered pair. With ``kappa = group_size - 1`` every center can hold its top-kappa at once.

    Returns:
        ``[n, n]`` float64 with ``n = n_groups * group_size`` (diagonal 0.5, unused).
    Raises:
        ValueError: ``high >= within`` (the group-mates would not be the best peers).
    """
    if high >= within:
        raise ValueError("need high < within so that group-mates are the best peers")
    n = n_groups * group_size
    g = torch.arange(n) // group_size
    rng = np.random.default_rng(seed)
    mu = torch.from_numpy(rng.uniform(low, high, size=(n, n)))
    mu = torch.where(g[:, None] == g[None, :], torch.full_like(mu, within), mu)
    mu.fill_diagonal_(0.5)
    return mu


def simulate(
    bandit: StationaryPeerBandit,
    rounds: int,
    kappa: int,
    gamma: float = 2.0,
    tau_acc: float = 0.5,
    epsilon: float | Callable[[int], float] = 0.1,
    seed: int = 0,
    candidates: Tensor | None = None,
    proposer_check: bool = True,
    acceptance: str = "first_come",
) -> BanditTrace:
    """Run the ABPS selection layer (Algorithm 1 without model training) on a stationary bandit.

    Each round ``t = 1..T``: UCB of eq. (7) -> propose-reject (Sec. 4.3) -> every partnered pair draws
    an observation -> Beta update of eq. (6).

    Args:
        bandit: the environment.
        rounds: ``T``.
        kappa, gamma, tau_acc: as in ABPS.
        epsilon: constant swap probability, or a function of the round ``t`` (e.g. ``lambda t: min(1, 1/t)``).
        seed: seeds matching and observation noise.
        candidates: ``[n, n]`` bool candidate sets (default: everyone).
        proposer_check, acceptance: see :func:`abps.matching.propose_reject`.
    Returns:
        :class:`BanditTrace`.
    """
    n = bandit.n
    beliefs = BetaBeliefs.prior(n)
    cand = candidates if candidates is not None else ~torch.eye(n, dtype=torch.bool)
    noise_rng = np.random.default_rng([seed, 1])
    regret = torch.zeros(rounds, dtype=torch.float64)
    isolation = torch.zeros(rounds, n, dtype=torch.bool)
    counts = torch.zeros(n, n, dtype=torch.long)
    for t in range(1, rounds + 1):
        eps = float(epsilon(t)) if callable(epsilon) else float(epsilon)
        m = propose_reject(
            beliefs.ucb(t, gamma), cand, kappa, tau_acc, eps, np.random.default_rng([seed, 0, t]), proposer_check,
            acceptance,
        )
        obs = bandit.sample(noise_rng)
        beliefs.update(obs, m.partners)
        regret[t - 1] = bandit.round_regret(m.partners, kappa).sum()
        isolation[t - 1] = m.resting
        counts += m.partners.to(torch.long)
    return BanditTrace(regret, isolation, counts, beliefs)
