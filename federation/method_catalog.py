"""The registered methods' names, Table 1 rows, families and order, readable without importing a
method (a copy of the registry's, checked by tests/test_cli_imports.py; docs/runtime.md, Module notes).
"""

from __future__ import annotations

#: (name, Table 1 row name, Figure 3 colour family, Table 1 row index or None), ABPS paper Table 1
#: order (Sec. 6.4), then the methods the paper does not have, by name.
CATALOG: tuple[tuple[str, str, str, int | None], ...] = (
    ("local", "Local-only (lower bound)", "local", 1),
    ("fedavg", "FedAvg", "star", 2),
    ("fedprox", "FedProx", "star", 3),
    ("feddyn", "FedDyn", "star", 4),
    ("moon", "MOON", "star", 5),
    ("decefl", "DeceFL", "decentralized", 6),
    ("defta", "DeFTA", "decentralized", 7),
    ("wpfed", "WPFed", "decentralized", 8),
    ("bnn-fl", "BNN+FL", "star", 9),
    ("abps", "ABPS (base, κ=3)", "abps", 10),
    ("abps+p", "ABPS+P (personalize)", "abps", 11),
    ("abps+q", "ABPS+Q (bfloat16)", "abps", 12),
    ("abps+p+q+k1", "ABPS+P+Q+κ=1", "abps", 13),
    ("fedavg-pq", "FedAvg+P+Q", "star", 14),
    ("abps-hom", "ABPS+P+Q+κ=1 (hom.)", "goal", 15),
    ("abps-div", "ABPS+P+Q+κ=1 (div.)", "goal", 16),
    ("abps-align", "ABPS+P+Q+κ=1 (align.)", "goal", 17),
    ("abps-x", "ABPS-X (ours, full)", "abps-x", 18),
    ("fedavg-x", "FedAvg-X (fair comp., full)", "star", 19),
    ("centralized", "Centralized (non-federated upper bound)", "centralized", 20),
    ("abps-drift", "ABPS + drift windows", "abps", None),
    ("random-partners", "Random partners (ablation, κ=1)", "abps", None),
    ("sage", "SAGE selector", "decentralized", None),
)

#: registered names in Table 1 order, then the others by name (as ``method_names()``)
METHOD_NAMES: tuple[str, ...] = tuple(row[0] for row in CATALOG)
#: Table 1 row order: the names with a row index, centralized last (as ``paper_order()``)
PAPER_ORDER: tuple[str, ...] = tuple(row[0] for row in sorted(CATALOG, key=lambda r: r[3] or 0) if row[3])
#: name -> Table 1 row name (as ``display_names()``)
DISPLAY: dict[str, str] = {row[0]: row[1] for row in CATALOG}
#: name -> Figure 3 colour family (as ``families()``)
FAMILY: dict[str, str] = {row[0]: row[2] for row in CATALOG}

#: the methods a peer-to-peer run drives: those whose preset ``federation.p2p.peer.check_p2p_config``
#: accepts (fedavg and the ABPS family without drift windows), in catalog order
P2P_METHODS: tuple[str, ...] = ("fedavg", "abps", "abps+p", "abps+q", "abps+p+q+k1", "abps-hom", "abps-div",
                                "abps-align", "abps-x", "random-partners")
