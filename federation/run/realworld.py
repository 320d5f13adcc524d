"""Real-world federation conditions in the round loop (docs/realworld.md).

Design notes: docs/runtime.md, "Module notes".
"""

from __future__ import annotations

import math

import torch

from federation.core.config import RealWorldConfig
from federation.data.tensors import FederatedData
from federation.engine.mlp import AdamState, StackedParams
from federation.methods.base import RoundPlan
from federation.run.availability import Availability
from federation.run.clock import Profiles, deadline_cut, finish_times

__all__ = ["RealWorld", "mask_mixing"]


def mask_mixing(w: torch.Tensor, receive: torch.Tensor, send: torch.Tensor) -> torch.Tensor:
    """Restrict a row-stochastic ``W [n, n]`` to the centers whose model is sent.

    Row ``i`` of the result: ``W[i, j] send_j / sum_k W[i, k] send_k`` when ``receive_i`` and that
    sum is positive; otherwise the identity row (center i keeps its own model).

    Args:
        w: ``[n, n]`` row-stochastic mixing matrix.
        receive: ``[n]`` bool, centers that take part in the exchange.
        send: ``[n]`` bool, centers whose update is aggregated (``send`` implies ``receive``).
    Returns:
        ``[n, n]`` row-stochastic, dtype of ``w``.
    """
    wm = w * send.to(w.dtype).unsqueeze(0)
    s = wm.sum(dim=1, keepdim=True)
    ok = receive & (s.squeeze(1) > 0)
    eye = torch.eye(w.shape[0], dtype=w.dtype)
    return torch.where(ok.unsqueeze(1), wm / s.clamp_min(torch.finfo(w.dtype).tiny), eye)


class RealWorld:
    """Availability, profiles and the virtual clock of one run (module docstring).

    Args:
        cfg: the ``realworld:`` block.
        data: the federation (center_ids, n_train).
        seed: the run seed.
        payload_bytes: bytes of one model transfer (the ledger's bytes per edge).
        local_epochs: local epochs per round (compute time).

    Raises:
        InputError: a bad trace or profile file.
    """

    def __init__(self, cfg: RealWorldConfig, data: FederatedData, seed: int, payload_bytes: int,
                 local_epochs: int) -> None:
        self.cfg = cfg
        self.n = data.n_centers
        self.n_train = data.n_train
        self.availability = Availability(cfg.availability, data.center_ids, seed)
        self.profiles = Profiles.build(cfg.profiles, data.center_ids)
        self.payload_bytes = int(payload_bytes)
        self.local_epochs = int(local_epochs)
        self.seconds = 0.0  # virtual time at the start of the current round
        self.available = torch.ones(self.n, dtype=torch.bool)
        self._held: tuple | None = None
        self._m: dict[str, float] = {}

    def state_dict(self) -> dict[str, float]:
        """The virtual clock (seconds at the next round's start), all that carries between rounds
        (availability is a function of round and hour): a round checkpoint's part."""
        return {"seconds": self.seconds}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Set the clock :meth:`state_dict` captured."""
        self.seconds = float(state["seconds"])

    @property
    def all_up(self) -> bool:
        """True when every center is available this round."""
        return bool(self.available.all())

    def begin_round(self, round_idx: int, params: StackedParams, state: AdamState,
                    momentum: StackedParams | None) -> torch.Tensor:
        """The round's availability ``[n]`` bool; holds the unavailable centers' rows."""
        self.available = self.availability.row(round_idx, self.seconds / 3600.0)
        self._held = None
        if not self.all_up:
            idx = torch.nonzero(~self.available).squeeze(1)
            self._held = (idx, {k: v[idx].clone() for k, v in params.items()},
                          {k: v[idx].clone() for k, v in state.m.items()},
                          {k: v[idx].clone() for k, v in state.v.items()}, state.t[idx].clone(),
                          {k: v[idx].clone() for k, v in momentum.items()} if momentum is not None else None)
        return self.available

    def after_training(self, params: StackedParams, state: AdamState) -> None:
        """Undo local training of the unavailable centers (parameters and Adam state)."""
        if self._held is None:
            return
        idx, p, m, v, t, _ = self._held
        for k in p:
            params[k][idx] = p[k]
        for k in m:
            state.m[k][idx] = m[k]
            state.v[k][idx] = v[k]
        state.t[idx] = t

    def plan(self, plan: RoundPlan) -> RoundPlan:
        """The method's plan restricted to this round's participants; times the round (clock)."""
        a = self.available
        n_avail = int(a.sum())
        server = plan.w is not None and plan.server_links > 0
        adjacency = plan.adjacency
        if plan.w is None:
            links = torch.zeros(self.n, dtype=torch.int64)
        elif server:
            links = a.to(torch.int64)
        else:
            if adjacency is not None and not self.all_up:
                adjacency = adjacency.bool() & a.unsqueeze(0) & a.unsqueeze(1)
            if adjacency is not None:
                sym = adjacency.bool() | adjacency.bool().T
                links = (sym & ~torch.eye(self.n, dtype=torch.bool)).sum(dim=1)
            else:  # a dense W without a declared graph: every nonzero off-diagonal entry is a link
                nz = (plan.w != 0) & ~torch.eye(self.n, dtype=torch.bool)
                links = (nz | nz.T).sum(dim=1) * a
        extra = (plan.probe_bytes + plan.metadata_bytes) / max(n_avail, 1)
        finish = finish_times(self.profiles, self.n_train, self.local_epochs, a, links, self.payload_bytes, extra)
        if server:
            on_time, duration = deadline_cut(finish, a, self.cfg.deadline)
        else:
            on_time, duration = a, (float(finish[a].max()) if n_avail else 0.0)
        w = plan.w
        if w is not None and not (self.all_up and bool(on_time.all())):
            w = mask_mixing(w, a, on_time)
            up_rows = w[a]
            if n_avail and n_avail < self.n and bool((up_rows == up_rows[:1]).all()):
                # the unavailable rows are restored after the exchange (end_exchange), so they may copy
                # the available centers' common row: FedAvg's W stays rank-one and is mixed with one
                # product (federation.engine.mixing.mix) instead of a dense [n, n] x [n, P] one
                w[~a] = up_rows[0]
        self._m = {
            "available_share": n_avail / self.n,
            "dropped_updates": float((a & ~on_time).sum()) if server else 0.0,
            "round_seconds": duration,
            "virtual_hours": (self.seconds + duration) / 3600.0,
        }
        if adjacency is not None and not server:
            rest = a & (links == 0)
            self._m["intentional_rest_share"] = float(rest.sum()) / n_avail if n_avail else math.nan
        self.duration = duration
        return RoundPlan(w=w, adjacency=adjacency, server_links=min(plan.server_links, n_avail),
                         probe_bytes=plan.probe_bytes, metadata_bytes=plan.metadata_bytes)

    def end_exchange(self, params: StackedParams, round_start: StackedParams,
                     momentum: StackedParams | None) -> None:
        """Unavailable centers end the round with the parameters (and momentum) they started it with;
        the clock moves to the next round's start."""
        if self._held is not None:
            idx, *_, mom = self._held
            for k in params:
                params[k][idx] = round_start[k][idx]
            if momentum is not None:
                for k in momentum:
                    momentum[k][idx] = mom[k] if mom is not None else 0.0
        self.seconds += max(self._m.get("round_seconds", 0.0), self.cfg.round_period_s)

    def metrics(self) -> dict[str, float]:
        """The round's availability and clock metrics (module docstring)."""
        return dict(self._m)
