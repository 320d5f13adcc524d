"""Plateau delay (eq. (2)), reaching times and model weight difference (Tian et al. 2404.04616)."""

import numpy as np
import pytest
import torch

from etl.errors import InputError
from federation.gossip.metrics import plateau_delay, reaching_times, weight_difference
from federation.gossip.model import ParamLayout

TICKS = np.array([0, 10, 20, 30, 40, 50])


def test_plateau_delay_excludes_rise_before_first_average():
    acc = np.array([0.1, 0.5, 0.52, 0.54, 0.80, 0.90])
    # slopes per interval: .04 (0-10), .002, .002, .026 (30-40), .01
    assert plateau_delay(TICKS, acc, t_first_average=10) == 35.0
    assert plateau_delay(TICKS, acc, t_first_average=0) == 5.0
    assert plateau_delay(TICKS, acc, t_first_average=41) is None


def test_plateau_delay_with_smoothing_hand_computed():
    acc = np.array([0.0, 0.0, 0.5, 0.6, 0.7, 1.0])
    # raw slopes x10: 0, .5, .1, .1, .3 -> steepest interval 10-20
    assert plateau_delay(TICKS, acc, 0, smooth=1) == 15.0
    # edge-padded centred mean of width 3: [0, 1/6, 11/30, 0.6, 23/30, 0.9]
    # -> differences 1/6, 0.2, 7/30, 1/6, 2/15: steepest interval 20-30
    assert plateau_delay(TICKS, acc, 0, smooth=3) == 25.0
    with pytest.raises(InputError):
        plateau_delay(TICKS, acc, 0, smooth=2)


def test_reaching_times():
    acc = np.array([[0.1, 0.1, 0.1, 0.1],
                    [0.5, 0.82, 0.3, 0.2],
                    [0.81, 0.85, 0.79, 0.9],
                    [0.81, 0.85, 0.8, 0.9]])
    r = reaching_times(np.array([0, 50, 100, 150]), acc, target=0.8, most_fraction=0.9)
    assert r == {"first": 50.0, "most": 150.0}
    r = reaching_times(np.array([0, 50, 100, 150]), acc, target=0.8, most_fraction=0.75)
    assert r == {"first": 50.0, "most": 100.0}
    assert reaching_times(np.array([0, 50, 100, 150]), acc, 0.95) == {"first": None, "most": None}


def test_weight_difference_hand_computed():
    layout = ParamLayout.from_shapes({"a.weight": (2,), "a.bias": (1,)})
    flat = torch.tensor([[0.0, 1.0, 9.0],
                         [1.0, 3.0, 9.0],
                         [2.0, 0.0, 9.0]])
    # ring: |m1-m0| = 1+2 = 3, |m2-m1| = 1+3 = 4, |m0-m2| = 2+1 = 3 -> 10 / 3
    assert weight_difference(flat, layout) == {"a": pytest.approx(10 / 3)}
