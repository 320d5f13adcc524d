"""Harmful-center study (issue 12): ABPS against ``random-partners`` on a federation with flipped centers.

Flips the labels of a share of the centers of a cohort (:mod:`abps.harmful`), runs both methods with
:data:`abps.harmful.STUDY_CONFIG` (kappa 1, bf16 wire, whole model exchanged; ABPS with gamma 0.05)
and prints, per round and method: the share of partnerships with a flipped center (at least one
end), the share of mixed healthy-flipped partnerships, the rest share and the healthy centers' mean
test AUROC; then the per-seed means over the second half of the rounds.

Usage::

    python -m benchmarks.run harmful      # reduced: FedProx-Synthetic 40 centers, 20 % flipped, 20 rounds, seed 11

Environment: ``ABPS_HARMFUL_COHORT`` (source cohort; default: ``abps synth fedprox``-style cohort of 40
centers sharing one risk function, written under the output folder), ``ABPS_HARMFUL_SHARE`` (0.2),
``ABPS_HARMFUL_ROUNDS`` (20), ``ABPS_HARMFUL_SEEDS`` ("11"), ``ABPS_HARMFUL_OUT``
(``bench_out/harmful``). Writes ``harmful.json`` (per-round rows of every run) there.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

METHODS = ("abps", "random-partners")


def main() -> None:
    """Run the study and print the per-round table and the late-round summary."""
    import torch

    from abps.harmful import mean_finite, read_harmful, study_config, study_rows, write_harmful_cohort
    from etl.io import atomic_write_text
    from federation.data import FederatedData
    from federation.runner import run_one
    from federation.synthetic import write_fedprox_cohort

    torch.set_num_threads(1)
    out = Path(os.environ.get("ABPS_HARMFUL_OUT", "bench_out/harmful"))
    out.mkdir(parents=True, exist_ok=True)
    share = float(os.environ.get("ABPS_HARMFUL_SHARE", "0.2"))
    rounds = int(os.environ.get("ABPS_HARMFUL_ROUNDS", "20"))
    seeds = [int(s) for s in os.environ.get("ABPS_HARMFUL_SEEDS", "11").split()]
    src = os.environ.get("ABPS_HARMFUL_COHORT")
    if not src:
        src = str(out / "source")
        if not (Path(src) / "centers.parquet").is_file():
            write_fedprox_cohort(src, n_centers=40, seed=3, mean_size=300.0, alpha=0.0, beta=0.1, shared=1.0)
    flipped_dir = out / "cohort"
    write_harmful_cohort(src, flipped_dir, share, seed=0)
    harmful = read_harmful(flipped_dir)
    data = FederatedData.from_cohort(flipped_dir)
    print(f"{data.n_centers} centers, {len(harmful)} flipped; {rounds} rounds; seeds {seeds}", flush=True)
    doc: dict = {"share": share, "rounds": rounds, "seeds": seeds, "n_centers": data.n_centers,
                 "n_harmful": len(harmful), "runs": []}
    late = slice(rounds // 2, rounds)
    for seed in seeds:
        per: dict[str, list[dict[str, float]]] = {}
        for name in METHODS:
            per[name] = study_rows(run_one(study_config(name, harmful, rounds), data, seed).history)
            doc["runs"].append({"method": name, "seed": seed, "rows": per[name]})
            atomic_write_text(out / "harmful.json", json.dumps(doc, indent=1, allow_nan=True) + "\n")
        print(f"\nseed {seed}: round | " + " | ".join(
            f"{m}: harmful / mixed / rest / healthy AUROC" for m in METHODS))
        for r in range(rounds):
            cells = [f"{per[m][r]['harmful_share']:.2f} / {per[m][r]['mixed_share']:.2f} / "
                     f"{per[m][r]['rest_share']:.2f} / {per[m][r]['healthy_auroc']:.3f}" for m in METHODS]
            print(f"{r + 1:5d} | " + " | ".join(cells))
        for m in METHODS:
            rows = per[m][late]
            print(f"{m:16s} rounds {late.start + 1}-{rounds}: harmful share "
                  f"{statistics.fmean(x['harmful_share'] for x in rows):.3f}, mixed share "
                  f"{statistics.fmean(x['mixed_share'] for x in rows):.3f}, rest share "
                  f"{statistics.fmean(x['rest_share'] for x in rows):.3f}, healthy AUROC "
                  f"{mean_finite([x['healthy_auroc'] for x in rows]):.3f}", flush=True)


if __name__ == "__main__":
    main()
