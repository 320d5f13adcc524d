"""Ledger arithmetic: FedAvg 1.00 over 50 rounds, FedAvg+P+Q = 0.5 x trunk share, kappa-3 mesh 1.5x."""

from __future__ import annotations

import networkx as nx
import torch

from federation.core.ledger import Ledger, undirected_edges
from federation.engine.mlp import exchanged_keys, n_params

N, D = 230, 56
SIZES = n_params(D, (128, 64))
FULL = sum(SIZES.values())


def test_fedavg_is_exactly_one_after_50_rounds():
    led = Ledger(N, FULL, 50)
    for r in range(50):
        led.record(r, None, server_links=N, exchanged_params=FULL, bytes_per_param=4)
    assert led.model_bytes == 50 * N * FULL * 4
    assert led.relative_bandwidth == 1.0


def test_fedavg_pq_is_half_the_trunk_share():
    trunk = sum(SIZES[k] for k in exchanged_keys(1))
    led = Ledger(N, FULL, 50)
    for r in range(50):
        led.record(r, None, server_links=N, exchanged_params=trunk, bytes_per_param=2, metadata_bytes=100)
    assert led.relative_bandwidth == 0.5 * trunk / FULL
    assert 0.49 < led.relative_bandwidth < 0.5  # the 1-layer head is 65 of ~17.6k parameters
    assert led.metadata_bytes == 5000 and led.total_bytes == led.model_bytes + 5000


def test_three_regular_mesh_is_one_and_a_half():
    g = nx.random_regular_graph(3, N, seed=0)
    adj = torch.zeros(N, N, dtype=torch.bool)
    for i, j in g.edges():
        adj[i, j] = True  # one direction only: the ledger symmetrizes
    assert undirected_edges(adj) == 3 * N // 2
    led = Ledger(N, FULL, 50)
    for r in range(50):
        led.record(r, adj, server_links=0, exchanged_params=FULL, bytes_per_param=4, probe_bytes=7)
    assert led.relative_bandwidth == 1.5
    assert led.probe_bytes == 350
