"""Check: "always on" reproduces today's runs exactly (docs/realworld.md).

Prints the JSON of every history, per-center figure and byte count of FedAvg, FedProx, ABPS, ABPS-X and
local-only on a 12-center FedProx-Synthetic cohort (3 rounds, seed 3). With the argument ``always`` each
run carries an explicit always-on ``realworld:`` block (its new per-round keys are left out). Run it once
on main's checkout and once on this one and compare the two outputs byte for byte::

    PYTHONPATH=/path/to/main python scripts/realworld_identity.py > main.json
    PYTHONPATH=$PWD python scripts/realworld_identity.py always > mine.json
    cmp main.json mine.json
"""

import json
import sys
import warnings

import torch

from federation.core.config import build_config
from federation.data.synthetic import generate_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.methods import get_method
from federation.run.runner import run_one

NEW_KEYS = ("available_share", "dropped_updates", "round_seconds", "virtual_hours", "intentional_rest_share")


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    cohort, centers = generate_fedprox_cohort(12, seed=1, mean_size=150.0)
    data = FederatedData.from_frames(cohort, centers)
    out = {}
    for m in ["fedavg", "fedprox", "abps", "abps-x", "local"]:
        cfg = build_config(m, get_method(m).default_config, None, rounds=3)
        if sys.argv[1:] == ["always"]:
            cfg = cfg.model_copy(update={"realworld": build_config(m, {}, {"realworld": {}}).realworld})
        r = run_one(cfg, data, 3)
        out[m] = {"hist": [{k: v for k, v in h.items() if k not in NEW_KEYS} for h in r.history],
                  "per_center": r.per_center, "bytes": r.total_bytes}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
