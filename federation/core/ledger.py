"""Communication ledger: bytes per round, cumulative bytes, bandwidth relative to FedAvg (ABPS paper
Sec. 5.4, 6.3; one payload per undirected edge that carried a model). Accounting: docs/ledger.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def undirected_edges(adjacency: torch.Tensor) -> int:
    """Number of unordered pairs {i, j}, i != j, with ``adjacency[i, j] or adjacency[j, i]``."""
    a = adjacency.bool()
    a = a | a.T
    return int(torch.triu(a, diagonal=1).sum())


@dataclass
class RoundBytes:
    """Bytes of one round: model payload bytes, probe bytes, metadata bytes, edges used."""

    round_idx: int
    edges: int
    model_bytes: int
    probe_bytes: int
    metadata_bytes: int


@dataclass
class Ledger:
    """Cumulative byte ledger of one run.

    Args:
        n_centers: n.
        full_params: parameters of one full model (all layers).
        reference_rounds: R_ref of the FedAvg denominator (50 in Table 1).
    """

    n_centers: int
    full_params: int
    reference_rounds: int = 50
    rounds: list[RoundBytes] = field(default_factory=list)

    @property
    def reference_bytes(self) -> int:
        """n x full fp32 model bytes x R_ref: FedAvg's cumulative bytes over R_ref rounds."""
        return self.n_centers * self.full_params * 4 * self.reference_rounds

    def record(
        self,
        round_idx: int,
        adjacency: torch.Tensor | None,
        server_links: int,
        exchanged_params: int,
        bytes_per_param: int,
        probe_bytes: int = 0,
        metadata_bytes: int = 0,
    ) -> RoundBytes:
        """Add one round.

        Args:
            adjacency: ``[n, n]`` bool, peer edges that carried a model (symmetrized here).
            server_links: center-server edges that carried a model (FedAvg: n).
            exchanged_params: parameters per payload (all, or trunk only).
            bytes_per_param: 4 (fp32) or 2 (bf16).
        """
        edges = server_links + (undirected_edges(adjacency) if adjacency is not None else 0)
        rb = RoundBytes(round_idx, edges, edges * exchanged_params * bytes_per_param, int(probe_bytes),
                        int(metadata_bytes))
        self.rounds.append(rb)
        return rb

    @property
    def model_bytes(self) -> int:
        """Cumulative model payload bytes."""
        return sum(r.model_bytes for r in self.rounds)

    @property
    def probe_bytes(self) -> int:
        """Cumulative probe bytes."""
        return sum(r.probe_bytes for r in self.rounds)

    @property
    def metadata_bytes(self) -> int:
        """Cumulative metadata bytes."""
        return sum(r.metadata_bytes for r in self.rounds)

    @property
    def total_bytes(self) -> int:
        """Model + probe + metadata bytes."""
        return self.model_bytes + self.probe_bytes + self.metadata_bytes

    @property
    def relative_bandwidth(self) -> float:
        """Cumulative model bytes / reference bytes (Table 1's "Bandwidth" column)."""
        return self.model_bytes / self.reference_bytes
