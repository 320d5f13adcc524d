"""Variance-corrected model averaging (Tian et al., arXiv 2404.04616, Sec. V, Algorithm 3).

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import torch

from etl.errors import InputError

#: Averaged-layer variances at or below this are treated as 0 (layer left unchanged).
VAR_EPS = 1e-30
_CHUNK = 64


def layer_variance(stacked: torch.Tensor) -> torch.Tensor:
    """Population variance of each model's tensor: ``[n, ...]`` -> ``[n]`` (float64).

    This is ``Var(l_i)`` of Algorithm 3, line 6, computed for all n models at once.
    """
    flat = stacked.reshape(stacked.shape[0], -1)
    # float64 in row chunks: exact enough for the equality tests, bounded memory at N = 1000
    return torch.cat([flat[i:i + _CHUNK].to(torch.float64).var(dim=1, unbiased=False)
                      for i in range(0, max(flat.shape[0], 1), _CHUNK)])


def rescale_to_variance(avg: torch.Tensor, target_var: torch.Tensor) -> torch.Tensor:
    """Rescale each row's tensor around its mean to a target variance (Algorithm 3, lines 9-11).

    Args:
        avg: ``[n, ...]`` averaged tensors, one per receiver.
        target_var: ``[n]`` target variance sigma_l^2 of each row (line 8).
    Returns:
        tensor like ``avg``: ``(v - mean) * sigma_l / sigma_lavg + mean`` per row; rows whose
        variance is <= ``VAR_EPS`` (or whose target is <= 0) are returned unchanged.
    """
    n = avg.shape[0]
    flat = avg.reshape(n, -1)
    vm = [torch.var_mean(flat[i:i + _CHUNK].to(torch.float64), dim=1, unbiased=False) for i in range(0, n, _CHUNK)]
    var_avg = torch.cat([v for v, _ in vm]) if vm else flat.new_zeros(0, dtype=torch.float64)
    mean = torch.cat([m for _, m in vm]) if vm else flat.new_zeros(0, dtype=torch.float64)
    ok = (var_avg > VAR_EPS) & (target_var > 0)
    scale = torch.where(ok, torch.sqrt(target_var.clamp_min(0) / var_avg.clamp_min(VAR_EPS)),
                        torch.ones_like(var_avg))
    # (v - mean) * scale + mean = v * scale + mean * (1 - scale)
    shift = (mean * (1.0 - scale)).to(avg.dtype).unsqueeze(1)
    out = torch.addcmul(shift, flat, scale.to(avg.dtype).unsqueeze(1))
    return out.view_as(avg)


def variance_corrected_average(buffer: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Algorithm 3 on one model buffer B.

    Args:
        buffer: name -> ``[N, *shape]``, the N received models' tensors (N >= 1).
    Returns:
        name -> ``[*shape]``: the average model with each tensor rescaled to the mean input
        variance (lines 2-11).
    Raises:
        InputError: empty buffer or tensors with different N.
    """
    sizes = {t.shape[0] for t in buffer.values()}
    if not buffer or len(sizes) != 1 or 0 in sizes:
        raise InputError("variance correction: the model buffer must hold N >= 1 models in every tensor")
    n = sizes.pop()
    uniform = torch.full((1, n), 1.0 / n, dtype=torch.float64)               # line 2: Average(B)
    return {name: t[0] for name, t in variance_corrected_mix(buffer, uniform).items()}


def variance_corrected_mix(stacked_params: dict[str, torch.Tensor], W: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mix stacked parameters with a row-stochastic ``W`` and correct each layer's variance.

    For every receiver i and tensor l: ``avg_i = sum_j W_ij theta_j`` (the mixing product the
    runtime uses for every method), ``sigma_l^2(i) = sum_j W_ij Var(theta_j,l)`` (the W-weighted
    form of Algorithm 3 line 8) and ``avg_i`` is rescaled around its mean to that variance
    (lines 9-11). A row that keeps its own model (``W_ii = 1``) is returned unchanged; rows mixing
    near-identical models are nearly unchanged (ratio sigma_l / sigma_lavg -> 1, Sec. V).

    Args:
        stacked_params: name -> ``[n, *shape]`` parameters of n centers/nodes.
        W: ``[m, n]`` non-negative mixing matrix whose rows sum to 1 (m receivers, usually m = n).
    Returns:
        name -> ``[m, *shape]`` mixed and variance-corrected parameters (same dtype as input).
    Raises:
        InputError: W is not 2-D with n columns, has negative entries, or rows not summing to 1.
    """
    if not stacked_params:
        return {}
    n = next(iter(stacked_params.values())).shape[0]
    if W.dim() != 2 or W.shape[1] != n:
        raise InputError(f"variance_corrected_mix: W must be [m, {n}], got {list(W.shape)}")
    Wd = W.to(torch.float64)
    if bool((Wd < 0).any()) or not torch.allclose(Wd.sum(1), torch.ones(W.shape[0], dtype=torch.float64), atol=1e-6):
        raise InputError("variance_corrected_mix: W must be non-negative with rows summing to 1")
    for name, theta in stacked_params.items():
        if theta.shape[0] != n:
            raise InputError(f"variance_corrected_mix: {name} has {theta.shape[0]} rows, expected {n}")
    mixed = {name: (W.to(theta.dtype) @ theta.reshape(n, -1)).view(W.shape[0], *theta.shape[1:])
             for name, theta in stacked_params.items()}
    return variance_correct(W, stacked_params, mixed)


def variance_correct(w: torch.Tensor, inputs: dict[str, torch.Tensor],
                     mixed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rescale each mixed layer to the W-weighted mean variance of its inputs (Algorithm 3, 5-11).

    For a mixing matrix the target of receiver i is ``sum_j W[i, j] Var(theta_j)`` (equal to
    line 8 for a uniform row). A row that keeps its own model (``W[i, i] = 1``) is returned
    unchanged up to float rounding.

    Args:
        w: ``[m, n]`` row-stochastic mixing matrix of the round.
        inputs: the stacked tensors that were mixed (``[n, ...]`` per key).
        mixed: ``W @ inputs`` per key (``[m, ...]``), e.g. from :func:`federation.engine.mixing.mix_params`
            (which may apply the bf16 wire format first).
    Returns:
        The corrected tensors (new tensors; same keys and shapes as ``mixed``).
    """
    wd = w.to(torch.float64)
    return {k: rescale_to_variance(m, wd @ layer_variance(inputs[k])) for k, m in mixed.items()}


def correct_flat(avg_flat: torch.Tensor, target_var: torch.Tensor, layout) -> torch.Tensor:
    """In-place Algorithm 3 lines 9-11 on flat stacked parameters.

    Args:
        avg_flat: ``[n, P]`` averaged models (modified in place and returned).
        target_var: ``[n, L]`` target variance per receiver and parameter tensor, in
            ``layout.names`` order (the mean of the received models' variances, line 8).
        layout: :class:`federation.gossip.model.ParamLayout` of the flat tensor.
    Returns:
        ``avg_flat``.
    """
    for j, view in enumerate(layout.views(avg_flat).values()):
        view.copy_(rescale_to_variance(view, target_var[:, j]))
    return avg_flat


def flat_layer_variance(flat: torch.Tensor, layout) -> torch.Tensor:
    """Per-node, per-tensor population variance of flat ``[n, P]`` parameters: ``[n, L]`` float64."""
    return torch.stack([layer_variance(v) for v in layout.views(flat).values()], dim=1)
