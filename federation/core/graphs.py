"""Communication graphs of the decentralized (peer-to-peer) baselines and their mixing weights.

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np
import torch

from etl.errors import InputError

GRAPH_KINDS: tuple[str, ...] = ("sparse", "ring", "k-regular", "erdos-renyi", "barabasi-albert", "star")
#: Short names used by the image benchmarks' presets -> the canonical kind.
GRAPH_ALIASES: dict[str, str] = {"er": "erdos-renyi", "ba": "barabasi-albert", "regular": "k-regular"}


def canonical_kind(kind: str) -> str:
    """The canonical graph kind of ``kind`` or one of its aliases (case-insensitive).

    Raises:
        InputError: unknown kind.
    """
    key = str(kind).strip().lower()
    key = GRAPH_ALIASES.get(key, key)
    if key not in GRAPH_KINDS:
        raise InputError(f"unknown graph kind {kind!r}; known: {', '.join(GRAPH_KINDS)} "
                         f"(aliases: {', '.join(f'{a}={c}' for a, c in GRAPH_ALIASES.items())})")
    return key


def sparse_connected_graph(n: int, seed: int) -> nx.Graph:
    """Connected random graph on ``0..n-1`` with exactly n undirected edges (n >= 3).

    A uniform random labelled tree (a Pruefer sequence of n - 2 uniform draws from
    ``0..n-1`` decoded by ``networkx.from_prufer_sequence``) plus one edge drawn uniformly
    from the pairs the tree does not hold, so the graph has exactly one cycle. For n = 2 the
    result is the single edge {0, 1}; for n = 1 the empty graph.

    Raises:
        InputError: n < 1.
    """
    if n < 1:
        raise InputError(f"graph needs at least one center, got n={n}")
    rng = np.random.default_rng(seed)
    if n <= 2:
        g = nx.empty_graph(n)
        if n == 2:
            g.add_edge(0, 1)
        return g
    g = nx.from_prufer_sequence(rng.integers(0, n, size=n - 2).tolist())
    iu, ju = np.triu_indices(n, k=1)
    adj = nx.to_numpy_array(g, nodelist=range(n), dtype=bool)
    free = np.flatnonzero(~adj[iu, ju])
    pick = free[rng.integers(0, free.size)]
    g.add_edge(int(iu[pick]), int(ju[pick]))
    return g


def ring_graph(n: int) -> nx.Graph:
    """The cycle 0-1-...-(n-1)-0 (n edges for n >= 3; a path for n = 2)."""
    if n < 1:
        raise InputError(f"graph needs at least one center, got n={n}")
    return nx.cycle_graph(n) if n >= 3 else nx.path_graph(n)


def k_regular_graph(n: int, k: int, seed: int) -> nx.Graph:
    """Uniform random k-regular graph (``networkx.random_regular_graph``), redrawn until
    connected (at most 100 draws).

    Raises:
        InputError: k >= n, or n k odd, or no connected draw.
    """
    if not 0 < k < n or (n * k) % 2:
        raise InputError(f"graph k-regular needs 0 < k < n and n*k even, got n={n}, k={k}")
    for attempt in range(100):
        g = nx.random_regular_graph(k, n, seed=int(seed) * 101 + attempt)
        if nx.is_connected(g):
            return g
    raise InputError(f"graph k-regular: no connected draw for n={n}, k={k} in 100 tries; raise k")


def erdos_renyi_graph(n: int, p: float, seed: int) -> nx.Graph:
    """G(n, p) redrawn until connected (at most 100 draws; ``networkx.gnp_random_graph``).

    Raises:
        InputError: p outside (0, 1] or no connected draw (p below the ln(n)/n threshold).
    """
    if not 0.0 < p <= 1.0:
        raise InputError(f"graph erdos-renyi needs 0 < p <= 1, got p={p}")
    for attempt in range(100):
        g = nx.gnp_random_graph(n, p, seed=int(seed) * 101 + attempt)
        if n == 1 or nx.is_connected(g):
            return g
    raise InputError(f"graph erdos-renyi: no connected draw for n={n}, p={p} in 100 tries; raise p "
                     f"above ln(n)/n = {np.log(max(n, 2)) / max(n, 2):.3f}")


def barabasi_albert_graph(n: int, m: int, seed: int) -> nx.Graph:
    """Preferential-attachment graph (``networkx.barabasi_albert_graph``), m edges per new node.

    Raises:
        InputError: m < 1 or m >= n.
    """
    if not 1 <= m < n:
        raise InputError(f"graph barabasi-albert needs 1 <= m < n, got n={n}, m={m}")
    return nx.barabasi_albert_graph(n, m, seed=int(seed))


def build_graph(kind: str, n: int, seed: int, k: int = 4, p: float = 0.05, m: int = 1) -> nx.Graph:
    """Draw a communication graph of ``kind`` (one of :data:`GRAPH_KINDS`) on n centers.

    Args:
        kind: graph family or alias (:func:`canonical_kind`); ``k`` is used by ``k-regular``,
            ``p`` by ``erdos-renyi``, ``m`` by ``barabasi-albert``.
        seed: graph seed (same seed -> same graph).

    Raises:
        InputError: unknown kind or parameters the family cannot satisfy.
    """
    kind = canonical_kind(kind)
    if kind == "star":
        if n < 1:
            raise InputError(f"graph needs at least one center, got n={n}")
        return nx.star_graph(n - 1)
    if kind == "sparse":
        return sparse_connected_graph(n, seed)
    if kind == "ring":
        return ring_graph(n)
    if kind == "k-regular":
        return k_regular_graph(n, k, seed)
    if kind == "erdos-renyi":
        return erdos_renyi_graph(n, p, seed)
    if kind == "barabasi-albert":
        return barabasi_albert_graph(n, m, seed)
    raise InputError(f"unknown graph kind {kind!r}; known: {', '.join(GRAPH_KINDS)}")


def neighbour_table(g: nx.Graph) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted neighbour lists of nodes ``0..n-1`` padded to the maximum degree.

    Returns:
        (cand long ``[n, D]`` with -1 padding, cand_valid bool ``[n, D]``, degree long ``[n]``);
        D = max(2, max degree).
    """
    k = g.number_of_nodes()
    nbrs = [sorted(g.neighbors(i)) for i in range(k)]
    d = max(2, max(len(nb) for nb in nbrs))
    cand = torch.full((k, d), -1, dtype=torch.long)
    for i, nb in enumerate(nbrs):  # setup only, once per run
        cand[i, :len(nb)] = torch.tensor(nb, dtype=torch.long)
    return cand, cand >= 0, torch.tensor([len(nb) for nb in nbrs], dtype=torch.long)


def adjacency_tensor(g: nx.Graph, n: int) -> torch.Tensor:
    """``[n, n]`` bool symmetric adjacency of ``g`` (no self-loops), nodes ``0..n-1``."""
    a = torch.zeros(n, n, dtype=torch.bool)
    if g.number_of_edges():
        e = torch.tensor(list(g.edges()), dtype=torch.int64)
        a[e[:, 0], e[:, 1]] = True
        a[e[:, 1], e[:, 0]] = True
    a.fill_diagonal_(False)
    return a


def metropolis_weights(adjacency: torch.Tensor) -> torch.Tensor:
    """Metropolis-Hastings mixing matrix of an undirected graph.

    ``W_ij = 1 / (1 + max(d_i, d_j))`` for every edge {i, j}, ``W_ij = 0`` for non-edges,
    ``W_ii = 1 - sum_{j != i} W_ij`` (the Metropolis-Hastings weights of Xiao & Boyd 2004,
    "Fast linear iterations for distributed averaging", Systems & Control Letters 53(1)). W is
    symmetric, non-negative and doubly stochastic (rows and columns sum to 1), the condition
    DeceFL's convergence analysis places on the weight matrix (Yuan et al. 2023).

    Args:
        adjacency: ``[n, n]`` bool, symmetric (symmetrized here), diagonal ignored.

    Returns:
        ``[n, n]`` float64.
    """
    a = adjacency.bool()
    a = (a | a.T).clone()
    a.fill_diagonal_(False)
    deg = a.sum(1).double()
    pair = 1.0 / (1.0 + torch.maximum(deg.unsqueeze(1), deg.unsqueeze(0)))
    w = torch.where(a, pair, torch.zeros((), dtype=torch.float64))
    w = w + torch.diag(1.0 - w.sum(1))
    return w


def edge_list(g: nx.Graph, center_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """The graph's edges as ``[{"i": int, "j": int, "center_i": str, "center_j": str}]`` (i < j,
    sorted): center indices and center ids only, no patient data."""
    out = []
    for i, j in sorted((min(u, v), max(u, v)) for u, v in g.edges()):
        row: dict[str, Any] = {"i": int(i), "j": int(j)}
        if center_ids is not None:
            row["center_i"], row["center_j"] = center_ids[i], center_ids[j]
        out.append(row)
    return out


def graph_summary(g: nx.Graph) -> dict[str, float]:
    """Edges, connected components, min / mean / max degree of ``g``."""
    deg = np.array([d for _, d in g.degree()], dtype=np.float64) if g.number_of_nodes() else np.zeros(1)
    return {
        "nodes": float(g.number_of_nodes()),
        "edges": float(g.number_of_edges()),
        "components": float(nx.number_connected_components(g)) if g.number_of_nodes() else 0.0,
        "degree_min": float(deg.min()),
        "degree_mean": float(deg.mean()),
        "degree_max": float(deg.max()),
    }
