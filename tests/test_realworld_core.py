"""Real-world building blocks: availability masks (trace, daily cycle, Bernoulli) checked by hand, the
trace / profile file errors, the virtual clock on a hand-computed 3-center case, the masked mixing
matrix and the ABPS matching with an unavailable center."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from abps.matching import propose_reject
from etl.errors import InputError
from federation.core.config import AvailabilityConfig, DeadlineConfig, ProfilesConfig, RealWorldConfig
from federation.methods.baselines import fedavg_matrix
from federation.run.availability import Availability
from federation.run.clock import Profiles, deadline_cut, finish_times
from federation.run.realworld import mask_mixing

IDS = ["A", "B", "C"]


def _mask(cfg: AvailabilityConfig, hours: list[float], ids=IDS, seed: int = 0) -> torch.Tensor:
    av = Availability(cfg, ids, seed)
    return av.mask(torch.arange(len(hours)), torch.tensor(hours, dtype=torch.float64))


def test_trace_mask_by_hand(tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text("center,start,end\nA,0,2\nA,5,6\nB,1,3\n")  # C is not listed
    hours = [0.0, 1.0, 2.0, 5.0, 5.99, 6.0]
    got = _mask(AvailabilityConfig(kind="trace", trace=str(f)), hours)
    # [start, end) half-open: A up at 0, 1, 5, 5.99; B at 1, 2; C never
    want = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert torch.equal(got, want)
    # unlisted centers available; a 4-hour period repeats the trace: 5.0 -> 1.0, 6.0 -> 2.0
    got = _mask(AvailabilityConfig(kind="trace", trace=str(f), trace_period_hours=4.0, trace_unlisted="available"),
                [5.0, 6.0, 7.0])
    want = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(got, want)


@pytest.mark.parametrize("body,needle", [
    ("center,start\nA,0\n", "column 'end' missing"),
    ("center,start,end\nA,x,2\n", "column 'start': row 2"),
    ("center,start,end\nA,0,2\nZ,0,1\n", "column 'center'"),
    ("center,start,end\nA,0,2\nB,3,3\n", "column 'end': row 3"),
    ("center,start,end\nA,-1,2\n", "column 'start': row 2"),
])
def test_trace_errors_name_file_and_column(tmp_path, body, needle):
    f = tmp_path / "bad.csv"
    f.write_text(body)
    with pytest.raises(InputError) as e:
        Availability(AvailabilityConfig(kind="trace", trace=str(f)), IDS)
    msg = str(e.value)
    assert needle in msg and "bad.csv" in msg and "\n" not in msg


def test_daily_cycle_by_hand():
    # local hour = (t + offset) mod 24; up in [8, 16)
    cfg = AvailabilityConfig(kind="daily", work_hours=(8.0, 16.0), utc_offsets=(0.0, 5.0, -8.0))
    got = _mask(cfg, [0.0, 8.0, 12.0, 20.0])
    # A: 0, 8, 12, 20 -> F T T F;  B: 5, 13, 17, 1 -> F T F F;  C: 16, 0, 4, 12 -> F F F T
    want = torch.tensor([[0, 0, 0], [1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(got, want)
    night = AvailabilityConfig(kind="daily", work_hours=(22.0, 6.0), utc_offsets="utc")
    assert _mask(night, [23.0, 3.0, 6.0, 12.0])[:, 0].tolist() == [True, True, False, False]


def test_daily_spread_share_and_preset_rate():
    ids = [f"c{i}" for i in range(2000)]
    cfg = AvailabilityConfig(kind="daily")  # preset window 8.0-15.2: 7.2 of 24 hours = 30 %
    m = _mask(cfg, [float(h) for h in range(48)], ids)
    assert abs(float(m.double().mean()) - 0.30) < 0.02
    off = Availability(cfg, ids).offsets
    assert float(off.min()) >= -12.0 and float(off.max()) < 12.0


def test_bernoulli_rate_counter_based_and_seeded():
    ids = [f"c{i}" for i in range(1000)]
    cfg = AvailabilityConfig(kind="bernoulli", rate=0.3)
    m = _mask(cfg, [0.0] * 200, ids, seed=4)
    assert abs(float(m.double().mean()) - 0.3) < 0.005
    # a center's draws depend only on (seed, round, center): the first 7 centers of a smaller federation agree
    assert torch.equal(_mask(cfg, [0.0] * 200, ids[:7], seed=4), m[:, :7])
    assert not torch.equal(_mask(cfg, [0.0] * 200, ids, seed=5), m)
    assert not _mask(AvailabilityConfig(kind="bernoulli", rate=0.0), [0.0] * 5, ids).any()


def test_config_refuses_incomplete_blocks():
    with pytest.raises(ValidationError, match="needs availability.trace"):
        AvailabilityConfig(kind="trace")
    with pytest.raises(ValidationError, match="round_period_s must be > 0"):
        RealWorldConfig(availability=AvailabilityConfig(kind="daily"))
    with pytest.raises(ValidationError, match="must be >= low"):
        ProfilesConfig(uplink={"low": 10.0, "high": 1.0})


def _profiles(tmp_path) -> Profiles:
    f = tmp_path / "profiles.csv"
    f.write_text("center,rows_per_s,uplink,downlink,latency_s\n"
                 "A,100,1000,2000,0.5\nB,400,2000,4000,0.1\nC,1000,500,1000,0.2\n")
    return Profiles.build(ProfilesConfig(file=str(f)), IDS)


def test_clock_three_centers_by_hand(tmp_path):
    p = _profiles(tmp_path)
    n_train = torch.tensor([100, 200, 300])
    up = torch.ones(3, dtype=torch.bool)
    # star: one payload of 1000 bytes up and down per center, 2 local epochs
    # compute 2*100/100 = 2, 2*200/400 = 1, 2*300/1000 = 0.6
    # transfer 0.5 + 1000/1000 + 1000/2000 = 2.0; 0.1 + 0.5 + 0.25 = 0.85; 0.2 + 2 + 1 = 3.2
    fin = finish_times(p, n_train, 2, up, torch.ones(3, dtype=torch.int64), 1000)
    assert torch.allclose(fin, torch.tensor([4.0, 1.85, 3.8], dtype=torch.float64))
    on, dur = deadline_cut(fin, up, DeadlineConfig())
    assert on.all() and dur == pytest.approx(4.0)
    on, dur = deadline_cut(fin, up, DeadlineConfig(policy="fixed", seconds=3.9))
    assert on.tolist() == [False, True, True] and dur == pytest.approx(3.9)
    on, dur = deadline_cut(fin, up, DeadlineConfig(policy="over_selection", keep_fraction=0.5))  # ceil(1.5) = 2
    assert on.tolist() == [False, True, True] and dur == pytest.approx(3.8)
    # peers: path B - A - C (A has 2 links): A transfers 0.5 + 2000/1000 + 2000/2000 = 3.5 -> 5.5
    fin = finish_times(p, n_train, 2, up, torch.tensor([2, 1, 1]), 1000)
    assert torch.allclose(fin, torch.tensor([5.5, 1.85, 3.8], dtype=torch.float64))
    # B unavailable: no compute, no transfer; C rests (no links): compute only
    fin = finish_times(p, n_train, 2, torch.tensor([True, False, True]), torch.tensor([0, 0, 0]), 1000)
    assert torch.allclose(fin, torch.tensor([2.0, 0.0, 0.6], dtype=torch.float64))


def test_profile_presets_and_file_errors(tmp_path):
    ids = [f"c{i}" for i in range(500)]
    mbit = 125_000.0
    p = Profiles.build(ProfilesConfig(uplink={"low": mbit, "high": 100 * mbit}), ids)
    assert float(p.uplink.min()) >= mbit and float(p.uplink.max()) <= 100 * mbit
    # log-uniform: the median is near the geometric mean 10 Mbit/s
    assert 7 * mbit < float(p.uplink.median()) < 14 * mbit
    assert torch.isinf(p.downlink).all() and (p.latency_s == 0).all() and not p.ideal
    assert Profiles.build(ProfilesConfig(), ids).ideal
    f = tmp_path / "prof.csv"
    f.write_text("center,rows_per_s,uplink,downlink,latency_s\nA,100,0,1,0\n")
    with pytest.raises(InputError, match=r"prof.csv: column 'uplink': row 2 is 0"):
        Profiles.build(ProfilesConfig(file=str(f)), IDS)


def test_masked_fedavg_matrix_by_hand():
    w = fedavg_matrix(torch.tensor([1, 2, 3, 4]))
    a = torch.tensor([True, False, True, True])
    got = mask_mixing(w, a, a)
    want = torch.tensor([[1, 0, 3, 4], [0, 8, 0, 0], [1, 0, 3, 4], [1, 0, 3, 4]], dtype=torch.float64) / 8
    assert torch.allclose(got, want, atol=1e-15, rtol=0)
    # a straggler (center 3 late) still receives the mean of the on-time updates
    got = mask_mixing(w, a, torch.tensor([True, False, True, False]))
    assert torch.allclose(got[3], torch.tensor([0.25, 0, 0.75, 0], dtype=torch.float64))


def test_matching_unavailable_center_gets_no_partner():
    n = 4
    ucb = torch.full((n, n), 0.9, dtype=torch.float64)
    cand = ~torch.eye(n, dtype=torch.bool)
    a = torch.tensor([True, False, True, True])
    for s in range(20):
        m = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(s), True, available=a)
        assert not m.partners[1].any() and not m.partners[:, 1].any()
        assert int(m.proposals[1]) == 0 and int(m.accepted[1]) == 0
        # a proposal to center 1 fails: the proposer goes on and finds an available partner unless taken
        assert int(m.accepted.sum()) == int(m.partners.sum()) // 2
    full = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(3), True)
    same = propose_reject(ucb, cand, 1, 0.5, 0.0, np.random.default_rng(3), True, available=torch.ones(n, dtype=torch.bool))
    assert torch.equal(full.partners, same.partners) and torch.equal(full.proposals, same.proposals)
