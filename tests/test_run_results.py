"""federation.run.results: the one results writer gives strict JSON (NaN / infinity as null)."""

import json
import math

import numpy as np
import torch

from federation.run.results import strict_json, write_results


def test_results_are_strict_json_with_numbers_kept(tmp_path):
    doc = {"auroc": np.float32(0.75), "rounds": np.int64(3), "undefined": float("nan"),
           "per_center": torch.tensor([0.5, float("inf")]), "ok": True, "nested": [{"x": -math.inf}]}
    out = tmp_path / "r" / "results.json"
    out.parent.mkdir()
    write_results(out, doc, indent=1)
    text = out.read_text()
    back = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # no NaN literal
    assert back == {"auroc": 0.75, "rounds": 3, "undefined": None, "per_center": [0.5, None], "ok": True,
                    "nested": [{"x": None}]}
    assert text == strict_json(doc, indent=1) and text.endswith("}\n")
    assert [p.name for p in out.parent.iterdir()] == ["results.json"]  # no temporary file left
