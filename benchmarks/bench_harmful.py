"""Harmful-center study: ABPS against ``random-partners`` on a federation with flipped centers.
Options: ``--help``; what it measures and how: docs/benchmarks.md, "Module notes".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

METHODS = ("abps", "random-partners")


def _traced_update(trace: list, flipped, gamma: float, tau_acc: float):
    """A stand-in for ``BetaBeliefs.update`` that also appends :func:`abps.harmful.belief_trace` of the
    round to ``trace`` (``ABPS_HARMFUL_TRACE=1``; diagnostic only, the update itself is unchanged)."""
    from abps.beliefs import BetaBeliefs, ucb_bonus
    from abps.harmful import belief_trace

    orig = BetaBeliefs.update

    def update(self, phi_bar, observed):
        before = self.pulls.clone()
        orig(self, phi_bar, observed)
        t = len(trace) + 2  # the update of round r (1-based) feeds the UCB of round r + 1
        untried = self.alpha0 / (self.alpha0 + self.beta0) + float(ucb_bonus(t, 0.0, gamma))
        trace.append(belief_trace(phi_bar, observed, before, self.ucb(t, gamma), untried, flipped, tau_acc))

    return update


def main() -> None:
    """Run the study and print the per-round table and the late-round summary."""
    import torch

    from abps.harmful import read_harmful, study_config, study_rows, window_summary, write_harmful_cohort
    from etl.io import atomic_write_text
    from federation.data.synthetic import write_fedprox_cohort
    from federation.data.tensors import FederatedData
    from federation.run.runner import run_one

    torch.set_num_threads(1)
    out = Path(os.environ.get("ABPS_HARMFUL_OUT", "bench_out/harmful"))
    out.mkdir(parents=True, exist_ok=True)
    share = float(os.environ.get("ABPS_HARMFUL_SHARE", "0.2"))
    rounds = int(os.environ.get("ABPS_HARMFUL_ROUNDS", "20"))
    seeds = [int(s) for s in os.environ.get("ABPS_HARMFUL_SEEDS", "11").split()]
    gamma = float(os.environ.get("ABPS_HARMFUL_GAMMA", "0.02"))
    acceptance = os.environ.get("ABPS_HARMFUL_ACCEPTANCE", "deferred")
    trace_on = os.environ.get("ABPS_HARMFUL_TRACE", "0") == "1"
    goal = os.environ.get("ABPS_HARMFUL_GOAL") or None
    metadata = os.environ.get("ABPS_HARMFUL_METADATA", "flipped")
    src = os.environ.get("ABPS_HARMFUL_COHORT")
    if not src:
        src = str(out / "source")
        if not (Path(src) / "centers.parquet").is_file():
            write_fedprox_cohort(src, n_centers=40, seed=3, mean_size=300.0, alpha=0.0, beta=0.1, shared=1.0)
    flipped_dir = out / "cohort"
    write_harmful_cohort(src, flipped_dir, share, seed=0, metadata=metadata)
    harmful = read_harmful(flipped_dir)
    data = FederatedData.from_cohort(flipped_dir)
    print(f"{data.n_centers} centers, {len(harmful)} flipped; {rounds} rounds; seeds {seeds}; ABPS gamma {gamma}, "
          f"acceptance {acceptance}; goal {goal}, flipped centers' metadata {metadata}", flush=True)
    doc: dict = {"share": share, "rounds": rounds, "seeds": seeds, "n_centers": data.n_centers,
                 "n_harmful": len(harmful), "gamma": gamma, "acceptance": acceptance, "goal": goal,
                 "metadata": metadata, "runs": []}
    # random-partners ignores gamma and acceptance: reuse its rows from an earlier harmful.json of the
    # same federation and length instead of training it again
    reuse: dict[int, list[dict[str, float]]] = {}
    prev = out / "harmful.json"
    if prev.is_file():
        old = json.loads(prev.read_text())
        if (old.get("rounds"), old.get("n_centers"), old.get("n_harmful"), old.get("goal"), old.get("metadata")) == (
                rounds, data.n_centers, len(harmful), goal, metadata):
            reuse = {r["seed"]: r["rows"] for r in old["runs"] if r["method"] == "random-partners"}
    windows = {"last 10": (max(1, rounds - 9), rounds), "second half": (rounds // 2 + 1, rounds)}
    verdict = []
    for seed in seeds:
        per: dict[str, list[dict[str, float]]] = {}
        for name in METHODS:
            if name == "random-partners" and seed in reuse:
                per[name] = reuse[seed]
            else:
                cfg = study_config(name, harmful, rounds, gamma, acceptance, goal)
                trace: list = []
                if trace_on and name == "abps":
                    from unittest import mock

                    from abps.beliefs import BetaBeliefs

                    flipped = torch.tensor([c in set(harmful) for c in data.center_ids])
                    with mock.patch.object(BetaBeliefs, "update", _traced_update(trace, flipped, gamma,
                                                                                  cfg.params.get("tau_acc", 0.5))):
                        per[name] = study_rows(run_one(cfg, data, seed).history)
                    for row, tr in zip(per[name], trace):
                        row.update(tr)
                else:
                    per[name] = study_rows(run_one(cfg, data, seed).history)
            doc["runs"].append({"method": name, "seed": seed, "rows": per[name]})
            atomic_write_text(out / "harmful.json", json.dumps(doc, indent=1, allow_nan=True) + "\n")
        print(f"\nseed {seed}: round | " + " | ".join(
            f"{m}: harmful / mixed / rest / healthy AUROC" for m in METHODS))
        for r in range(rounds):
            cells = [f"{per[m][r]['harmful_share']:.2f} / {per[m][r]['mixed_share']:.2f} / "
                     f"{per[m][r]['rest_share']:.2f} / {per[m][r]['healthy_auroc']:.3f}" for m in METHODS]
            tr = per["abps"][r]
            if "protected" in tr:  # ABPS_HARMFUL_TRACE=1
                cells.append(f"trace: first-contact mixed {tr['first_contact_mixed']:.2f}, phi_bar h<-h "
                             f"{tr['phi_hh']:.2f} h<-f {tr['phi_hf']:.2f}, h-h at/below untried "
                             f"{tr['hh_below_untried']:.2f}, protected {tr['protected']:.2f}, blocked h-f "
                             f"{tr['blocked_hf']:.2f}, untried healthy per flipped {tr['untried_left']:.1f}")
            print(f"{r + 1:5d} | " + " | ".join(cells))
        for wname, (a, b) in windows.items():
            summ = {m: window_summary(per[m], a, b) for m in METHODS}
            for m in METHODS:
                x = summ[m]
                print(f"{m:16s} rounds {a}-{b} ({wname}): harmful share {x['harmful_share']:.3f}, mixed share "
                      f"{x['mixed_share']:.3f}, isolation rate {x['rest_share']:.3f}, healthy AUROC "
                      f"{x['healthy_auroc']:.3f}", flush=True)
            ratio = summ["abps"]["mixed_share"] / summ["random-partners"]["mixed_share"]
            ok = ratio <= 0.5 and summ["abps"]["healthy_auroc"] >= summ["random-partners"]["healthy_auroc"]
            print(f"  mixed share ABPS / random = {ratio:.2f}x; criterion (<= 0.5x, healthy AUROC not below): "
                  f"{'met' if ok else 'NOT met'}", flush=True)
            if wname == "last 10":
                verdict.append((seed, ratio, ok))
    print("\nby round " + str(rounds) + " (last 10 rounds), per seed: " + ", ".join(
        f"{s_}: {r:.2f}x {'met' if ok else 'NOT met'}" for s_, r, ok in verdict), flush=True)


if __name__ == "__main__":
    main()
