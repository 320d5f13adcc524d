"""Communication graphs and Metropolis-Hastings weights (federation.core.graphs)."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from etl.errors import InputError
from federation.core.graphs import (
    adjacency_tensor,
    build_graph,
    edge_list,
    graph_summary,
    metropolis_weights,
    sparse_connected_graph,
)


def test_metropolis_hand_computed_path() -> None:
    # path 0-1-2: d = (1, 2, 1); W_01 = W_12 = 1/(1+2); W_00 = W_22 = 2/3; W_11 = 1/3
    adj = adjacency_tensor(nx.path_graph(3), 3)
    w = metropolis_weights(adj)
    expected = torch.tensor([[2 / 3, 1 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 1 / 3, 2 / 3]], dtype=torch.float64)
    torch.testing.assert_close(w, expected)


@pytest.mark.parametrize("kind", ["sparse", "ring", "k-regular", "erdos-renyi", "barabasi-albert"])
def test_metropolis_doubly_stochastic_symmetric_nonnegative(kind: str) -> None:
    g = build_graph(kind, 40, seed=7, k=4, p=0.2, m=2)
    adj = adjacency_tensor(g, 40)
    w = metropolis_weights(adj)
    ones = torch.ones(40, dtype=torch.float64)
    torch.testing.assert_close(w.sum(1), ones, atol=1e-12, rtol=0)
    torch.testing.assert_close(w.sum(0), ones, atol=1e-12, rtol=0)
    torch.testing.assert_close(w, w.T, atol=0, rtol=0)
    assert bool((w >= 0).all())
    # support = edges + diagonal, and each edge weight is 1/(1+max degree)
    off = w.clone().fill_diagonal_(0)
    assert torch.equal(off > 0, adj)
    deg = adj.sum(1).double()
    i, j = adj.nonzero(as_tuple=True)
    torch.testing.assert_close(w[i, j], 1.0 / (1.0 + torch.maximum(deg[i], deg[j])))


@pytest.mark.parametrize("n", [3, 4, 12, 230])
@pytest.mark.parametrize("seed", [0, 11, 22])
def test_default_graph_connected_with_n_edges(n: int, seed: int) -> None:
    g = sparse_connected_graph(n, seed)
    assert sorted(g.nodes()) == list(range(n))
    assert g.number_of_edges() == n
    assert nx.is_connected(g)
    assert nx.number_of_selfloops(g) == 0
    assert int(adjacency_tensor(g, n).sum()) == 2 * n  # symmetric, no duplicates


def test_default_graph_fixed_per_seed() -> None:
    a = sorted(sparse_connected_graph(50, 5).edges())
    b = sorted(sparse_connected_graph(50, 5).edges())
    c = sorted(sparse_connected_graph(50, 6).edges())
    assert a == b
    assert a != c


def test_tiny_federations() -> None:
    assert sparse_connected_graph(1, 0).number_of_edges() == 0
    assert sorted(sparse_connected_graph(2, 0).edges()) == [(0, 1)]
    assert metropolis_weights(torch.zeros(1, 1, dtype=torch.bool)).tolist() == [[1.0]]


def test_other_families() -> None:
    assert build_graph("ring", 9, 0).number_of_edges() == 9
    kr = build_graph("k-regular", 20, 3, k=4)
    assert {d for _, d in kr.degree()} == {4} and nx.is_connected(kr)
    ba = build_graph("barabasi-albert", 30, 1, m=2)
    assert ba.number_of_edges() == (30 - 2) * 2
    er = build_graph("erdos-renyi", 30, 1, p=0.3)
    assert nx.is_connected(er)


def test_bad_graph_parameters() -> None:
    with pytest.raises(InputError, match="unknown graph kind"):
        build_graph("hypercube", 5, 0)
    with pytest.raises(InputError, match="k-regular"):
        build_graph("k-regular", 5, 0, k=3)  # n k odd
    with pytest.raises(InputError, match="erdos-renyi"):
        build_graph("erdos-renyi", 200, 0, p=0.001)  # far below ln(n)/n: never connected
    with pytest.raises(InputError, match="barabasi-albert"):
        build_graph("barabasi-albert", 5, 0, m=5)


def test_edge_list_and_summary_carry_center_ids_only() -> None:
    g = nx.Graph([(2, 0), (1, 2)])
    rows = edge_list(g, ["MICU|2110-2111", "CCU|2110-2111", "SICU|2112-2113"])
    assert rows == [
        {"i": 0, "j": 2, "center_i": "MICU|2110-2111", "center_j": "SICU|2112-2113"},
        {"i": 1, "j": 2, "center_i": "CCU|2110-2111", "center_j": "SICU|2112-2113"},
    ]
    s = graph_summary(g)
    assert s == {"nodes": 3.0, "edges": 2.0, "components": 1.0, "degree_min": 1.0, "degree_mean": 4 / 3,
                 "degree_max": 2.0}


def test_star_and_aliases_one_naming() -> None:
    star = build_graph("star", 5, 0)
    assert sorted(star.edges()) == [(0, 1), (0, 2), (0, 3), (0, 4)]  # hub 0 (variance paper III-C1)
    assert sorted(build_graph("er", 30, 1, p=0.3).edges()) == sorted(build_graph("erdos-renyi", 30, 1, p=0.3).edges())
    assert sorted(build_graph("BA", 20, 2, m=3).edges()) == sorted(build_graph("barabasi-albert", 20, 2, m=3).edges())
    from federation.core.graphs import neighbour_table
    cand, valid, deg = neighbour_table(star)
    assert deg.tolist() == [4, 1, 1, 1, 1]
    assert cand[0].tolist() == [1, 2, 3, 4] and cand[1].tolist() == [0, -1, -1, -1]
    assert valid.sum().item() == 8
