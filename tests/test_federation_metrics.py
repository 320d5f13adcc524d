"""Batched AUROC against scikit-learn, ties, one-class centers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from federation.core.metrics import batched_auroc, grouped_auroc, summarize


def test_batched_auroc_equals_sklearn_with_ties_and_padding():
    g = torch.Generator().manual_seed(0)
    m, rows = 12, 80
    scores = torch.randint(0, 6, (m, rows), generator=g).float()  # many ties
    scores[::2] += torch.rand(6, rows, generator=g)  # half the rows continuous
    labels = (torch.rand(m, rows, generator=g) < 0.3).float()
    mask = torch.rand(m, rows, generator=g) < 0.75
    auc = batched_auroc(scores, labels, mask)
    for i in range(m):
        sel = mask[i].numpy()
        ref = roc_auc_score(labels[i].numpy()[sel], scores[i].numpy()[sel])
        assert math.isclose(float(auc[i]), ref, abs_tol=1e-12)


def test_hand_computed_and_one_class():
    # positives score 0.8 and 0.4, negatives 0.4 and 0.1: pairs (0.8>0.4, 0.8>0.1, tie 0.5, 0.4>0.1) -> 3.5/4
    s = torch.tensor([[0.8, 0.4, 0.4, 0.1], [0.1, 0.2, 0.3, 0.4]])
    y = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    auc = batched_auroc(s, y, mask)
    assert float(auc[0]) == 0.875 and math.isnan(float(auc[1]))
    summ = summarize(torch.tensor([0.6, float("nan"), 0.8], dtype=torch.float64))
    assert summ.n_excluded == 1
    assert math.isclose(summ.mean, 0.7) and math.isclose(summ.std, float(np.std([0.6, 0.8])))


def test_grouped_auroc_equals_masked_auroc_and_sklearn_with_ties():
    """One shared sort gives every subgroup's AUROC exactly as a masked sort does (ties included),
    and scikit-learn's roc_auc_score on each subgroup; column k is the whole row."""
    g = torch.Generator().manual_seed(3)
    m, rows, k = 4, 57, 3
    s = torch.randint(0, 7, (m, rows), generator=g).double()  # heavy ties
    y = torch.randint(0, 2, (m, rows), generator=g)
    grp = torch.randint(-1, k, (m, rows), generator=g)  # -1: in no subgroup
    grp[0, grp[0] == 2] = -1  # subgroup 2 empty in row 0 -> NaN
    got = grouped_auroc(s, y, grp, k)
    assert got.shape == (m, k + 1)
    assert torch.isnan(got[0, 2])
    for i in range(m):
        for j in range(k):
            sel = grp[i] == j
            if sel.sum() and 0 < int(y[i][sel].sum()) < int(sel.sum()):
                assert got[i, j].item() == pytest.approx(roc_auc_score(y[i][sel].numpy(), s[i][sel].numpy()), abs=1e-12)
            assert torch.allclose(got[i, j:j + 1], batched_auroc(s[i:i + 1], y[i:i + 1], sel[None]), equal_nan=True)
        assert got[i, k].item() == pytest.approx(roc_auc_score(y[i].numpy(), s[i].numpy()), abs=1e-12)
