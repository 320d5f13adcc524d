"""Batched classification metrics for K clients at once (SAGE paper Sec. V-C, Tables I-II).

Global accuracy and macro-F1 are computed for every client's personalised predictor
(omega_k, phi_k) on the shared test set and averaged over clients; client accuracy (mean) and
worst-client accuracy (Weak) come from each client's local evaluation split.
"""

from __future__ import annotations

import torch
from torch import Tensor


def confusion_matrices(y_true: Tensor, y_pred: Tensor, n_classes: int, mask: Tensor | None = None) -> Tensor:
    """Per-client confusion matrices long [K, C, C] (rows: true class, cols: predicted).

    Args:
        y_true: long [K, N] or [N] (shared labels); y_pred: long [K, N]; mask: bool [K, N] valid.
    """
    k, n = y_pred.shape
    yt = y_true.expand(k, n) if y_true.dim() == 1 else y_true
    code = (torch.arange(k)[:, None] * n_classes + yt) * n_classes + y_pred
    if mask is not None:
        code = code[mask]
    return torch.bincount(code.flatten(), minlength=k * n_classes * n_classes).view(k, n_classes, n_classes)


def macro_f1(cm: Tensor) -> Tensor:
    """Macro-F1 per client from confusion matrices [K, C, C] -> float64 [K].

    F1_c = 2 TP / (2 TP + FP + FN), averaged over the classes present in y_true or y_pred
    (scikit-learn's ``f1_score(average='macro')`` with zero_division = 0).
    """
    cm = cm.to(torch.float64)
    tp = cm.diagonal(dim1=1, dim2=2)
    fp = cm.sum(1) - tp
    fn = cm.sum(2) - tp
    den = 2 * tp + fp + fn
    present = den > 0
    f1 = torch.where(present, 2 * tp / den.clamp(min=1), torch.zeros_like(den))
    return f1.sum(1) / present.sum(1).clamp(min=1)


def accuracy(y_true: Tensor, y_pred: Tensor, mask: Tensor | None = None) -> Tensor:
    """Per-client accuracy float64 [K] (masked entries ignored; NaN for a client with none)."""
    k, n = y_pred.shape
    yt = y_true.expand(k, n) if y_true.dim() == 1 else y_true
    hit = (yt == y_pred).to(torch.float64)
    if mask is None:
        return hit.mean(1)
    m = mask.to(torch.float64)
    cnt = m.sum(1)
    return torch.where(cnt > 0, (hit * m).sum(1) / cnt.clamp(min=1), torch.full_like(cnt, float("nan")))
