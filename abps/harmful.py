"""A federation with harmful centers, where ABPS's rest rule (Lemma 1) must fire.

Design notes: docs/abps.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch

from etl.errors import InputError
from etl.io import atomic_output_dir
from federation.core.config import build_config
from federation.methods import get_method

__all__ = ["STUDY_CONFIG", "choose_harmful", "flip_centers", "write_harmful_cohort", "read_harmful", "study_config",
           "study_rows", "window_summary", "mean_finite", "belief_trace", "main"]

MANIFEST = "harmful.json"

#: Run config of the harmful-center study, shared by ABPS and ``random-partners`` (config overrides).
#: kappa 1 and the bf16 wire as ABPS+P+Q+kappa=1, but no personalized head: a personalized last layer
#: absorbs a label flip with one sign change, so a flipped center would not be harmful. Local
#: training is stronger than the clinical default (lr 0.02, 5 local epochs) so that a center's model
#: reflects its own label function again after one round of averaging.
STUDY_CONFIG: dict = {"engine": {"lr": 0.02, "local_epochs": 5},
                      "exchange": {"head_layers": 0, "bf16_wire": True}, "params": {"kappa": 1}}


def choose_harmful(center_ids: Sequence[str], share: float, seed: int) -> list[str]:
    """``round(share * n)`` center_ids (at least 1 when ``share > 0``) drawn uniformly without replacement.

    Returns:
        The chosen ids in their original order.
    Raises:
        InputError: ``share`` outside [0, 1) or no centers.
    """
    if not 0.0 <= share < 1.0:
        raise InputError(f"--share must be in [0, 1), got {share}")
    n = len(center_ids)
    if n == 0:
        raise InputError("the cohort has no centers")
    k = 0 if share == 0 else min(n - 1, max(1, round(share * n)))
    picked = set(np.random.default_rng(seed).choice(n, size=k, replace=False).tolist())
    return [c for i, c in enumerate(center_ids) if i in picked]


def flip_centers(
    cohort: pl.DataFrame, centers: pl.DataFrame, harmful: Sequence[str], metadata: str = "flipped"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Flip the label of every stay of the ``harmful`` centers and update the label columns of ``centers``.

    Args:
        cohort: cohort.parquet frame (needs ``center_id``, ``label``).
        centers: centers.parquet frame (needs ``center_id``, ``pos_rate``, ``meta_pos_rate``).
        harmful: center_ids to flip.
        metadata: ``flipped`` (the published positive rates follow the flipped labels) or ``kept``
            (a flipped center publishes its positive rates from before the flip, so a goal filter on
            metadata cannot tell it apart and only the Bayesian selection can).
    Returns:
        ``(cohort, centers)`` with the same columns, types and row order.
    Raises:
        InputError: a harmful id is not a center of the cohort, or a column is missing.
    """
    for col, frame, name in (("label", cohort, "cohort.parquet"), ("pos_rate", centers, "centers.parquet"),
                             ("meta_pos_rate", centers, "centers.parquet")):
        if col not in frame.columns:
            raise InputError(f"{name}: missing column {col!r}")
    if metadata not in ("flipped", "kept"):
        raise InputError(f"--metadata {metadata!r}: must be 'flipped' or 'kept'")
    known = set(centers["center_id"].to_list())
    unknown = [c for c in harmful if c not in known]
    if unknown:
        raise InputError(f"unknown center_id {unknown[0]!r}")
    hit = pl.col("center_id").is_in(list(harmful))
    dtype = cohort.schema["label"]
    cohort = cohort.with_columns(pl.when(hit).then(1 - pl.col("label")).otherwise(pl.col("label")).cast(dtype)
                                 .alias("label"))
    if metadata == "flipped":
        centers = centers.with_columns(
            [pl.when(hit).then(1.0 - pl.col(c)).otherwise(pl.col(c)).cast(centers.schema[c]).alias(c)
             for c in ("pos_rate", "meta_pos_rate")]
        )
    return cohort, centers


def write_harmful_cohort(src: str | Path, out: str | Path, share: float = 0.2, seed: int = 0,
                         metadata: str = "flipped") -> list[str]:
    """Read the cohort in ``src``, flip ``share`` of its centers (:func:`flip_centers`, ``metadata``
    as there), write the new cohort and ``harmful.json`` into ``out`` atomically.

    Returns:
        The flipped center_ids.
    Raises:
        InputError: missing files, ``out`` equal to ``src`` or a non-empty folder that is not an earlier
            output of this command, bad ``share``.
    """
    srcp, outp = Path(src), Path(out)
    files = [srcp / "cohort.parquet", srcp / "centers.parquet"]
    for f in files:
        if not f.is_file():
            raise InputError(f"--cohort {src}: {f.name} not found")
    if outp.resolve() == srcp.resolve():
        raise InputError("--out must differ from --cohort")
    if outp.is_dir() and any(outp.iterdir()) and not (outp / MANIFEST).is_file():
        raise InputError(f"--out {out}: not empty and not an earlier harmful-cohort output")
    cohort, centers = pl.read_parquet(files[0]), pl.read_parquet(files[1])
    harmful = choose_harmful(centers["center_id"].to_list(), share, seed)
    cohort, centers = flip_centers(cohort, centers, harmful, metadata)
    with atomic_output_dir(out) as tmp:
        cohort.write_parquet(tmp / "cohort.parquet")
        centers.write_parquet(tmp / "centers.parquet")
        (tmp / MANIFEST).write_text(json.dumps({"generator": "python -m abps.harmful", "mode": "flip",
                                                "share": share, "seed": seed, "metadata": metadata,
                                                "harmful_centers": harmful},
                                               indent=2) + "\n")
    return harmful


def read_harmful(cohort_dir: str | Path) -> list[str]:
    """The flipped center_ids listed in ``cohort_dir/harmful.json``.

    Raises:
        InputError: no manifest.
    """
    p = Path(cohort_dir) / MANIFEST
    if not p.is_file():
        raise InputError(f"{cohort_dir}: no {MANIFEST} (not written by python -m abps.harmful)")
    return list(json.loads(p.read_text())["harmful_centers"])


def study_config(method: str, harmful: Sequence[str], rounds: int, gamma: float = 0.02,
                 acceptance: str = "deferred", goal: str | None = None) -> object:
    """The :class:`federation.core.config.RunConfig` of one study arm: :data:`STUDY_CONFIG` with
    ``watch_centers`` = the flipped ids; ABPS arms also get ``gamma`` (default 0.02: small enough
    for a UCB to fall below tau_acc after one bad partnership, see
    :func:`abps.beliefs.max_resting_gamma`, and for a peer known to help by the median healthy credit,
    phi ~ +0.02 AUROC, to outrank an untried one after one pull, which needs gamma < 0.04) and
    the receiver rule ``acceptance`` (default ``deferred``: :mod:`abps.matching` step 7; with
    ``first_come`` untried harmful proposers keep winning free slots, docs/fidelity.md). ``goal``:
    the goal-aware pre-filter of both arms (Sec. 4.1, Algorithm 1 line 10; default none).
    """

    params = {**STUDY_CONFIG["params"], "watch_centers": list(harmful)}
    if goal is not None:
        params["goal"] = goal
    if method != "random-partners":
        params["gamma"] = gamma
        params["acceptance"] = acceptance
    doc = {**STUDY_CONFIG, "params": params}
    return build_config(method, get_method(method).default_config, doc, rounds=rounds)


def study_rows(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """Per-round study figures from a run's history (a method run with ``watch_centers`` = the flipped ids).

    Returns:
        One dict per round: round, harmful_share, mixed_share, rest_share, healthy_auroc.
    Raises:
        KeyError: the run did not watch any center.
    """
    return [{"round": h["round"], "harmful_share": h["watched_partnership_share"],
             "mixed_share": h["mixed_partnership_share"], "rest_share": h["isolation_rate"],
             "healthy_auroc": h["unwatched_test_auroc_mean"]} for h in history]


def window_summary(rows: list[dict[str, float]], start: int, stop: int) -> dict[str, float]:
    """Means of :func:`study_rows` over rounds ``start..stop`` (1-based, inclusive): harmful_share,
    mixed_share, rest_share (plain means) and healthy_auroc (mean of the finite values)."""
    sel = [r for r in rows if start <= r["round"] <= stop]
    out = {k: mean_finite([r[k] for r in sel]) for k in ("harmful_share", "mixed_share", "rest_share")}
    out["healthy_auroc"] = mean_finite([r["healthy_auroc"] for r in sel])
    return out


def belief_trace(phi_bar: torch.Tensor, observed: torch.Tensor, pulls_before: torch.Tensor, ucb_next: torch.Tensor,
                 untried_next: float, flipped: torch.Tensor, tau_acc: float = 0.5) -> dict[str, float]:
    """Diagnostic figures of one ABPS belief update in a harmful-center federation (docs/fidelity.md).

    Args:
        phi_bar: ``[n, n]`` clipped Shapley utilities of the round (``[i, j]``: what i saw of j).
        observed: ``[n, n]`` bool, the ordered pairs observed this round.
        pulls_before: ``[n, n]`` pull counts before the update (0 = first contact).
        ucb_next: ``[n, n]`` UCB scores of the next round after the update (eq. 7).
        untried_next: the UCB of an untried peer in the next round (prior mean + full bonus).
        flipped: ``[n]`` bool, the flipped centers.
        tau_acc: acceptance threshold.

    Returns:
        ``first_contact_mixed`` (share of mixed observed pairs seen for the first time),
        ``phi_hh`` / ``phi_hf`` (mean phi_bar a healthy center saw of a healthy / flipped partner),
        ``hh_below_untried`` (share of healthy-healthy observations whose receiver now scores the
        partner at or below an untried peer), ``protected`` (share of healthy centers holding a met
        healthy peer scored above an untried peer), ``blocked_hf`` (share of met (healthy, flipped)
        pairs whose healthy side scores the flipped peer below tau_acc), ``untried_left`` (mean
        number of healthy peers a flipped center has not met). NaN where a share has no denominator.
    """
    n = flipped.numel()
    off = ~torch.eye(n, dtype=torch.bool)
    obs = observed.to(torch.bool) & off
    f_i, f_j = flipped.unsqueeze(1), flipped.unsqueeze(0)
    mixed = obs & (f_i != f_j)
    hh, hf = obs & ~f_i & ~f_j, obs & ~f_i & f_j
    met = (pulls_before + obs.double()) > 0

    def share(num: torch.Tensor, den: torch.Tensor) -> float:
        d = int(den.sum())
        return float(num.sum()) / d if d else math.nan

    def mean_of(x: torch.Tensor, m: torch.Tensor) -> float:
        return float(x[m].double().mean()) if bool(m.any()) else math.nan

    met_hh = met & off & ~f_i & ~f_j
    best_known = torch.where(met_hh, ucb_next, torch.full_like(ucb_next, -math.inf)).max(1).values
    healthy = ~flipped
    met_hf = met & ~f_i & f_j
    return {"first_contact_mixed": share(mixed & (pulls_before == 0), mixed),
            "phi_hh": mean_of(phi_bar, hh), "phi_hf": mean_of(phi_bar, hf),
            "hh_below_untried": share(hh & (ucb_next <= untried_next), hh),
            "protected": share(healthy & (best_known > untried_next), healthy),
            "blocked_hf": share(met_hf & (ucb_next < tau_acc), met_hf),
            "untried_left": float((~met & off & f_i & ~f_j).sum(1)[flipped].double().mean())
            if bool(flipped.any()) else math.nan}


def mean_finite(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when none)."""
    ok = [v for v in values if math.isfinite(v)]
    return sum(ok) / len(ok) if ok else float("nan")


def main(argv: list[str] | None = None) -> int:
    """``python -m abps.harmful --cohort SRC --out DST [--share S] [--seed K]``; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m abps.harmful", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cohort", required=True, help="source cohort directory (cohort.parquet + centers.parquet)")
    ap.add_argument("--out", required=True, help="new cohort directory")
    ap.add_argument("--share", type=float, default=0.2, help="share of centers whose labels are flipped")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draw of flipped centers")
    ap.add_argument("--metadata", choices=("flipped", "kept"), default="flipped",
                    help="published positive rates of a flipped center: after the flip, or kept from before")
    a = ap.parse_args(argv)
    try:
        harmful = write_harmful_cohort(a.cohort, a.out, a.share, a.seed, a.metadata)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(harmful)} of the centers flipped -> {a.out} (list in {MANIFEST})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
