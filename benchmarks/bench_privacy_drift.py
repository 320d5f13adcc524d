"""Privacy-utility and drift studies of ABPS (docs/privacy.md), with a figure.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from abps.goal_filter import candidate_mask
from abps.method import PRESETS, AbpsParams
from abps.privacy import MetadataRelease
from etl.io import atomic_write_text
from federation.core.config import build_config
from federation.data.drift_scenario import LabelFlipDrift, drift_centers
from federation.data.tensors import FederatedData
from federation.methods.registry import METHODS, get_method, register
from federation.run.runner import run_one
from federation.run.tracking import finite

GOAL_PRESETS = {"homogeneity": "abps-hom", "diversity": "abps-div", "alignment": "abps-align"}
EPSILONS = (0.1, 0.5, 1.0, 2.0, 5.0, math.inf)


def _watching(preset: str) -> str:
    """Register (once) a subclass of ``preset`` that also reports the partnerships touching the
    flipped centers and the Welch detections on pairs with a flipped peer (benchmark only)."""
    name = f"bench-watch-{preset}"
    base = PRESETS[preset]

    class Watch(base):  # type: ignore[misc, valid-type]
        flipped: torch.Tensor | None = None

        def setup(self, ctx):  # noqa: ANN001
            super().setup(ctx)
            self._det = torch.zeros(ctx.n, ctx.n, dtype=torch.long)
            self._tst = torch.zeros(ctx.n, ctx.n, dtype=torch.long)

        def after_exchange(self, ctx, round_idx, plan):  # noqa: ANN001
            out = super().after_exchange(ctx, round_idx, plan)
            f = type(self).flipped
            upper = torch.triu(self.last.partners, 1)
            touch = upper & (f[:, None] | f[None, :])
            out["watched_edges"] = float(touch.sum())
            out["edges_total"] = float(upper.sum())
            # mean posterior mean of the other centers about the flipped ones (c_neg = tau_acc = 0.5)
            out["belief_about_flipped"] = float(self.beliefs.mean()[~f][:, f].mean())
            if self.drift is not None:
                new = self.drift.detections - self._det
                new_t = self.drift.tested - self._tst
                self._det, self._tst = self.drift.detections.clone(), self.drift.tested.clone()
                unaffected = ~f[:, None] & ~f[None, :]
                out["det_flipped_peer"] = float(new[~f][:, f].sum())  # others detect a flipped peer
                out["det_unaffected"] = float(new[unaffected].sum())  # neither side flipped: false alarms
                out["tests_unaffected"] = float(new_t[unaffected].sum())
            return out

    Watch.__name__ = f"Watch_{preset.replace('-', '_')}"
    Watch.name = name
    if name not in METHODS:
        register(Watch)
    return name


def candidate_overlap(data: FederatedData, goal: str, eps: float, seed: int) -> dict[str, float]:
    """Overlap of the candidate sets from the DP-released metadata with the exact ones (same noise
    as a run with this seed: :class:`abps.privacy.MetadataRelease`)."""
    p = AbpsParams(goal=goal, kappa=1, metadata="full", metadata_dp_epsilon=eps)
    exact = data.meta.double()
    noisy = MetadataRelease(p, data.n_train, seed).release(exact)
    a, _ = candidate_mask(exact, goal, p.keep_fraction, p.normalize_metadata)
    b, _ = candidate_mask(noisy.double(), goal, p.keep_fraction, p.normalize_metadata)
    inter, union = int((a & b).sum()), int((a | b).sum())
    return {"kept_share": inter / max(int(a.sum()), 1), "jaccard": inter / max(union, 1)}


def privacy_study(data: FederatedData, rounds: int, seeds: list[int], overlap_seeds: int,
                  epsilons: tuple[float, ...] = EPSILONS) -> list[dict[str, Any]]:
    rows = []
    for goal, preset in GOAL_PRESETS.items():
        for eps in epsilons:
            ov = [candidate_overlap(data, goal, eps, s) for s in range(overlap_seeds)]
            for seed in seeds:
                cfg = build_config(preset, PRESETS[preset].default_config,
                                   {"method": preset, "params": {"metadata_dp_epsilon": None if math.isinf(eps) else eps}}, rounds=rounds)
                t0 = time.perf_counter()
                res = run_one(cfg, data, seed)
                h = res.history
                rows.append({
                    "goal": goal, "epsilon": eps, "seed": seed,
                    "isolation_share": sum(r["isolation_rate"] for r in h) / len(h),
                    "mean_partners": sum(r["mean_partners"] for r in h) / len(h),
                    "final_auroc": res.final_auroc_mean,
                    "epsilon_spent": res.method_summary.get("dp_epsilon_spent"),
                    "kept_share": sum(o["kept_share"] for o in ov) / len(ov),
                    "jaccard": sum(o["jaccard"] for o in ov) / len(ov),
                    "seconds": time.perf_counter() - t0,
                })
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _stop_rounds(edges: list[float], total: list[float], flip_round: int) -> tuple[int | None, int | None]:
    """(rounds after the flip until the flipped centers' share of partnerships is at most half its
    pre-flip mean for 2 rounds running, ... until they hold no partnership for 3 rounds running);
    None when it never happens in the run. Rounds are 1-based; the flip acts from ``flip_round``."""
    share = [e / t if t else 0.0 for e, t in zip(edges, total)]
    pre = share[: flip_round - 1]
    ref = sum(pre) / len(pre) if pre else 0.0
    half = zero = None
    for k in range(flip_round - 1, len(share)):
        if half is None and all(s <= 0.5 * ref for s in share[k:k + 2]) and k + 2 <= len(share):
            half = k + 1 - flip_round
        if zero is None and k + 3 <= len(share) and all(e == 0 for e in edges[k:k + 3]):
            zero = k + 1 - flip_round
    return half, zero


def drift_study(data: FederatedData, rounds: int, seeds: list[int], flip_round: int, flip_count: int,
                gamma: float, window: int, alpha: float, decay: float) -> list[dict[str, Any]]:
    drift = LabelFlipDrift(round=flip_round, count=flip_count)
    flipped = drift_centers(data, drift)
    variants = {"abps": {}, f"belief_decay={decay}": {"belief_decay": decay},
                f"welch w={window}": {"drift_window": window, "drift_alpha": alpha}}
    name = _watching("abps")
    get_method(name).flipped = flipped
    rows = []
    for label, extra in variants.items():
        for seed in seeds:
            cfg = build_config(name, {}, {"method": name, "params": {"gamma": gamma, **extra},
                                          "drift": drift.model_dump()}, rounds=rounds)
            t0 = time.perf_counter()
            res = run_one(cfg, data, seed)
            h = res.history
            edges = [r["watched_edges"] for r in h]
            total = [r["edges_total"] for r in h]
            half, zero = _stop_rounds(edges, total, flip_round)
            belief = [r["belief_about_flipped"] for r in h]
            below = [k for k in range(flip_round - 1, len(h)) if belief[k] < 0.5]
            row: dict[str, Any] = {"variant": label, "seed": seed, "gamma": gamma, "watched_edges": edges,
                                   "edges_total": total, "rounds_to_half": half, "rounds_to_stop": zero,
                                   "belief_about_flipped": belief,
                                   "rounds_to_belief_below_half": (below[0] + 1 - flip_round) if below else None,
                                   "final_auroc": res.final_auroc_mean,
                                   "test_auroc": [r["test_auroc_mean"] for r in h],
                                   "seconds": time.perf_counter() - t0}
            if "det_flipped_peer" in h[0]:
                det_f = [r["det_flipped_peer"] for r in h]
                after = [k for k in range(flip_round - 1, len(h)) if det_f[k] > 0]
                row["detection_delay"] = (after[0] + 1 - flip_round) if after else None
                row["detections_flipped_peer"] = sum(det_f)
                row["false_alarms"] = sum(r["det_unaffected"] for r in h)
                row["tests_unaffected"] = sum(r["tests_unaffected"] for r in h)
                row["tests_total"] = res.method_summary.get("drift_tests_total")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}), flush=True)
    return rows


def figure(priv: list[dict[str, Any]], drift: list[dict[str, Any]], path: Path, flip_round: int) -> None:
    """Privacy-utility panels (AUROC, isolation rate, candidate overlap vs epsilon per goal) and the
    drift panel (share of partnerships touching a flipped center per round, per variant)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 5, figsize=(22, 4))
    if priv:
        eps_vals = sorted({r["epsilon"] for r in priv})
        xs = list(range(len(eps_vals)))
        labels = ["inf" if math.isinf(e) else f"{e:g}" for e in eps_vals]
        for goal in GOAL_PRESETS:
            for a, key in zip(ax[:3], ("final_auroc", "isolation_share", "kept_share")):
                ys = []
                for e in eps_vals:
                    v = [r[key] for r in priv if r["goal"] == goal and r["epsilon"] == e and r[key] is not None]
                    ys.append(sum(v) / len(v) if v else float("nan"))
                a.plot(xs, ys, marker="o", label=goal)
        for a, title in zip(ax[:3], ("final test AUROC", "isolation rate", "exact candidate pairs kept")):
            a.set_xticks(xs, labels)
            a.set_xlabel("epsilon per release")
            a.set_title(title)
            a.legend(fontsize=8)
    if drift:
        for label in dict.fromkeys(r["variant"] for r in drift):
            runs = [r for r in drift if r["variant"] == label]
            n = len(runs[0]["watched_edges"])
            share = [sum(r["watched_edges"][k] / max(r["edges_total"][k], 1) for r in runs) / len(runs)
                     for k in range(n)]
            ax[3].plot(range(1, n + 1), share, marker=".", label=label)
            if "belief_about_flipped" in runs[0]:
                bel = [sum(r["belief_about_flipped"][k] for r in runs) / len(runs) for k in range(n)]
                ax[4].plot(range(1, n + 1), bel, marker=".", label=label)
        for a, title in ((ax[3], "share of partnerships touching a flipped center"),
                         (ax[4], "mean belief about the flipped centers")):
            a.axvline(flip_round, color="grey", ls="--")
            a.set_xlabel("round")
            a.set_title(title, fontsize=10)
            a.legend(fontsize=8)
        ax[4].axhline(0.5, color="grey", ls=":")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohort", help="cohort directory for the privacy-utility study")
    ap.add_argument("--from-json", nargs="+", help="only redraw the figure from earlier privacy_drift.json files")
    ap.add_argument("--drift-cohort", help="cohort directory for the drift study (default: --cohort)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--drift-rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 22])
    ap.add_argument("--overlap-seeds", type=int, default=20)
    ap.add_argument("--flip-round", type=int, default=8)
    ap.add_argument("--flip-count", type=int, default=2)
    ap.add_argument("--gamma", type=float, default=2.0, help="UCB gamma of the drift study")
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--decay", type=float, default=0.9)
    ap.add_argument("--skip", choices=("privacy", "drift"), action="append", default=[])
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out_dir)
    if a.from_json:
        docs = [json.loads(Path(f).read_text()) for f in a.from_json]
        priv = [{**r, "epsilon": math.inf if r["epsilon"] is None else r["epsilon"]} for d in docs for r in d["privacy"]]
        drift = [r for d in docs for r in d["drift"]]
        flip = next((d["args"]["flip_round"] for d in docs if d["drift"]), a.flip_round)
        figure(priv, drift, out / "privacy_drift.png", flip)
        print(f"wrote {out / 'privacy_drift.png'}")
        return
    if not a.cohort:
        ap.error("--cohort is required unless --from-json is given")
    priv = [] if "privacy" in a.skip else privacy_study(FederatedData.from_cohort(a.cohort), a.rounds, a.seeds,
                                                          a.overlap_seeds)
    drift = [] if "drift" in a.skip else drift_study(
        FederatedData.from_cohort(a.drift_cohort or a.cohort), a.drift_rounds, a.seeds, a.flip_round, a.flip_count,
        a.gamma, a.window, a.alpha, a.decay)
    doc = {"args": vars(a), "privacy": priv, "drift": drift}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "privacy_drift.json", json.dumps(finite(doc), indent=1, allow_nan=False) + "\n")
    figure(priv, drift, out / "privacy_drift.png", a.flip_round)
    print(f"wrote {out / 'privacy_drift.json'} and {out / 'privacy_drift.png'}")


if __name__ == "__main__":
    main()
