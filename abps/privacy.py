"""Differentially private release of the ABPS metadata vectors v_i (ABPS paper Sec. 7, future work (i)).

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import functools
import math

import torch
from pydantic import Field, model_validator
from torch import Tensor

from federation.core.config import NumbersNotFlags
from federation.core.seeding import mix_seed

__all__ = [
    "MetadataDpParams",
    "noise_multiplier",
    "sensitivity",
    "composed_epsilon",
    "metadata_sums",
    "metadata_from_sums",
    "MetadataRelease",
]

#: Public admission-year range of the clip (shifted MIMIC-IV years; the synthetic cohort spans 2110..2200).
YEAR_RANGE: tuple[int, int] = (2100, 2220)
_YEAR_SCALE = 2030.0  # v_i's year coordinate is mean admission year / 2030 (etl.mimic.center_metadata)
_STREAM = 0xD9E7A  # generator stream of the metadata noise (mix_seed(seed, stream, release))


class MetadataDpParams(NumbersNotFlags):
    """Method parameters of the DP metadata release (ABPS config ``params:``; mixed into AbpsParams).

    Attributes:
        metadata_dp_epsilon: epsilon per release; None (the default) or ``inf`` = off: no noise, no
            budget. (None, not inf, is the default: a run config refuses non-finite numbers, and a
            resolved config dumped as JSON, as sweeps do, must validate again.)
        metadata_dp_delta: delta per release, in (0, 1).
        metadata_dp_year_range: public ``[first, last]`` admission year of the per-stay clip.
        metadata_dp_max_stays: ``m``, most train stays one patient contributes to a center's sums.
    """

    metadata_dp_epsilon: float | None = Field(None, gt=0.0)
    metadata_dp_delta: float = Field(1e-5, gt=0.0, lt=1.0)
    metadata_dp_year_range: tuple[int, int] = YEAR_RANGE
    metadata_dp_max_stays: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _year_range(self) -> MetadataDpParams:
        lo, hi = self.metadata_dp_year_range
        if not hi > lo:
            raise ValueError(f"metadata_dp_year_range must be [first, last] with last > first, got [{lo}, {hi}]")
        return self


@functools.lru_cache(maxsize=64)
def noise_multiplier(epsilon: float, delta: float) -> float:
    """Noise std of the Gaussian mechanism per unit of L2 sensitivity for one (epsilon, delta) release.

    Calibrated by ``dp_accounting.get_sigma_gaussian`` (the analytic Gaussian mechanism, Balle and
    Wang, ICML 2018: the smallest sigma for which the Gaussian mechanism is (epsilon, delta)-DP).

    Returns:
        ``z``; the mechanism adds ``N(0, (z * Delta_2)^2)`` per coordinate. 0 for ``epsilon = inf``.
    Raises:
        ValueError: epsilon <= 0 or delta outside (0, 1).
    """
    if not epsilon > 0:
        raise ValueError(f"metadata_dp_epsilon must be > 0, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"metadata_dp_delta must be in (0, 1), got {delta}")
    if math.isinf(epsilon):
        return 0.0
    import dp_accounting

    return float(dp_accounting.get_sigma_gaussian(epsilon, delta))


def _year_clip(year_range: tuple[int, int]) -> tuple[float, float]:
    """``(mid / 2030, B)``: centre and half-width of the clipped year contribution in v_i units."""
    lo, hi = year_range
    return (lo + hi) / 2.0 / _YEAR_SCALE, (hi - lo) / 2.0 / _YEAR_SCALE


def sensitivity(dim: int, year_range: tuple[int, int] = YEAR_RANGE, max_stays: int = 1) -> float:
    """L2 sensitivity of the sum vector ``s_i`` under add/remove one patient (docs/privacy.md).

    Args:
        dim: 3 (base v_i) or 15 (with the 12 Charlson prevalences).
        year_range: public admission-year clip range.
        max_stays: ``m``, the most stays one patient contributes.
    Returns:
        ``m sqrt(1 + 1 + B^2 + (dim - 3))`` with ``B = (last - first) / 2 / 2030``.
    Raises:
        ValueError: dim not 3 or 15.
    """
    if dim not in (3, 15):
        raise ValueError(f"metadata dimension must be 3 or 15, got {dim}")
    _, b = _year_clip(year_range)
    return max_stays * math.sqrt(2.0 + b * b + (dim - 3))


def composed_epsilon(z: float, releases: int, delta: float) -> float:
    """Epsilon spent by ``releases`` Gaussian releases of noise multiplier ``z``, at ``delta``.

    Composition by ``dp_accounting``'s PLD accountant (add/remove-one neighbouring relation).

    Returns:
        0.0 for no release, ``inf`` for ``z = 0`` (no noise) with at least one release.
    """
    if releases <= 0:
        return 0.0
    if z <= 0:
        return math.inf
    return _composed_epsilon(float(z), int(releases), float(delta))


@functools.lru_cache(maxsize=256)
def _composed_epsilon(z: float, releases: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), releases)
    return float(acc.get_epsilon(delta))


def metadata_sums(meta: Tensor, n_train: Tensor, year_range: tuple[int, int] = YEAR_RANGE) -> Tensor:
    """The per-patient sums behind v_i (step 1 of the module docstring), computed inside each center.

    Args:
        meta: ``[n, d]`` v_i (d = 3 or 15; META_COLUMNS order: pos rate, ln n_train, year / 2030, cci...).
        n_train: ``[n]`` train patients per center.
        year_range: public year clip range; the mean year offset is clipped to ``[-B, B]`` (equal to
            the per-patient clip whenever every admission year lies in the range).
    Returns:
        ``[n, d]`` float64: ``[n_i, S_label, S_year_centred, S_cci...]``.
    """
    m = meta.to(torch.float64)
    n = n_train.to(torch.float64)
    mid, b = _year_clip(year_range)
    s = m * n[:, None]
    s[:, 1] = n
    s[:, 2] = (m[:, 2] - mid).clamp(-b, b) * n
    return s


def metadata_from_sums(s: Tensor, year_range: tuple[int, int] = YEAR_RANGE) -> Tensor:
    """Post-processing of (noisy) sums back to a v_i vector (step 4 of the module docstring).

    Args:
        s: ``[n, d]`` sums from :func:`metadata_sums` (plus noise).
    Returns:
        ``[n, d]`` float64 v_i: shares clipped to [0, 1], ``ln max(n, 1)``, year in the public range / 2030.
    """
    mid, b = _year_clip(year_range)
    n = s[:, 1].clamp(min=1.0)
    v = (s / n[:, None]).clamp(0.0, 1.0)
    v[:, 1] = n.log()
    v[:, 2] = mid + (s[:, 2] / n).clamp(-b, b)
    return v


class MetadataRelease:
    """The centers' metadata releases of one run: noise, release counts, privacy spent.

    Args:
        params: the method's parameters (any model with the :class:`MetadataDpParams` fields).
        n_train: ``[n]`` train patients per center.
        seed: run seed (the noise generator is seeded from it).
    """

    #: instances may be rebuilt from a round checkpoint (federation.run.checkpoint.read)
    __checkpoint_state__ = True

    def __init__(self, params: MetadataDpParams, n_train: Tensor, seed: int) -> None:
        eps = params.metadata_dp_epsilon
        self.epsilon = math.inf if eps is None else float(eps)
        self.delta = float(params.metadata_dp_delta)
        self.year_range = tuple(params.metadata_dp_year_range)
        self.max_stays = int(params.metadata_dp_max_stays)
        self.z = noise_multiplier(self.epsilon, self.delta)
        self.n_train = n_train.to(torch.float64)
        self.seed = int(seed)
        self.releases = torch.zeros(n_train.shape[0], dtype=torch.long)
        self.calls = 0
        self.published: Tensor | None = None  # [n, d] the vectors as last released (what peers hold)
        self.exact: Tensor | None = None  # [n, d] the exact vectors behind them (kept inside each center)

    @property
    def enabled(self) -> bool:
        """True when a finite epsilon is set (the mechanism adds noise)."""
        return self.z > 0.0

    def sigma(self, dim: int) -> float:
        """Noise std on each sum coordinate: ``z * Delta_2`` (0 when off)."""
        return self.z * sensitivity(dim, self.year_range, self.max_stays) if self.enabled else 0.0

    def release(self, meta: Tensor, centers: Tensor | None = None) -> Tensor:
        """Release the metadata of ``centers`` (default: all) and return what the federation holds.

        Off (``epsilon = inf``): returns ``meta`` itself, unchanged. On: each releasing center adds
        fresh Gaussian noise to its sums (one draw per call from the seeded generator) and publishes
        the post-processed vector; the others keep their last published vector. Each releasing center's
        count goes up by one.

        Args:
            meta: ``[n, d]`` exact v_i of every center.
            centers: ``[n]`` bool, the centers that (re-)send; all on the first call.
        Returns:
            ``[n, d]`` float64 published metadata (``meta`` unchanged when off).
        Raises:
            ValueError: shape mismatch with the centers of the run.
        """
        n = self.n_train.shape[0]
        if meta.ndim != 2 or meta.shape[0] != n:
            raise ValueError(f"metadata must be [{n}, d], got shape {tuple(meta.shape)}")
        sel = torch.ones(n, dtype=torch.bool) if centers is None or self.published is None else centers.to(torch.bool)
        self.releases += sel.to(torch.long)
        self.calls += 1
        exact = meta.to(torch.float64)
        if not self.enabled:
            self.exact = exact.clone()
            self.published = exact.clone()
            return meta
        gen = torch.Generator().manual_seed(mix_seed(self.seed, _STREAM, self.calls))
        s = metadata_sums(exact, self.n_train, self.year_range)
        noise = torch.randn(s.shape, generator=gen, dtype=torch.float64) * self.sigma(int(meta.shape[1]))
        noisy = metadata_from_sums(s + noise, self.year_range)
        if self.published is None or self.exact is None:
            self.published, self.exact = noisy, exact.clone()
        else:
            self.published = torch.where(sel[:, None], noisy, self.published)
            self.exact = torch.where(sel[:, None], exact, self.exact)
        return self.published.clone()

    def changed(self, meta: Tensor) -> Tensor:
        """``[n]`` bool: centers whose exact v_i differs from the one behind their last release
        (checked inside each center; all True before the first release)."""
        if self.exact is None:
            return torch.ones(meta.shape[0], dtype=torch.bool)
        return (meta.to(torch.float64) != self.exact).any(dim=1)

    def spent(self) -> dict[str, float]:
        """Privacy spent so far (final metrics / results.json).

        Keys: ``dp_epsilon_spent`` (composed epsilon of the center with the most releases, at
        ``dp_delta``; 0 with no release; inf when releases were made without noise),
        ``dp_delta`` (the per-release delta the epsilon is stated at), ``dp_epsilon_per_release``,
        ``dp_sigma_multiplier`` (z), ``dp_releases`` (total releases over centers),
        ``dp_max_releases_per_center``.
        """
        k = int(self.releases.max()) if self.releases.numel() else 0
        return {
            "dp_epsilon_spent": composed_epsilon(self.z, k, self.delta),
            "dp_delta": self.delta,
            "dp_epsilon_per_release": self.epsilon,
            "dp_sigma_multiplier": self.z,
            "dp_releases": float(self.releases.sum()),
            "dp_max_releases_per_center": float(k),
        }
