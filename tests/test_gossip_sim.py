"""Tick-based gossip simulation (Sec. III-A, III-C) and the ``benchmark: vv`` entry point."""

import numpy as np
import pytest
import torch

from etl.errors import InputError
from etl.images import FASHION_MNIST_DIR, ImageDataset, load_idx_dataset
from federation.gossip import GossipConfig, expand_runs, simulate


@pytest.fixture(scope="module")
def tiny_data(tiny_images: ImageDataset) -> ImageDataset:
    return tiny_images


def _cfg(**kw) -> GossipConfig:
    base = dict(n_nodes=6, degree=2, ticks=40, eval_every=20, test_subset=50, batch_size=4, own_subset=8)
    if kw.get("topology") == "star":       # the star reads no degree
        del base["degree"]
    if kw.get("transfer_threshold") is None:  # own_subset is read by the transfer-learning rule only
        del base["own_subset"]
    return GossipConfig(**{**base, **kw})


def test_synchronous_counts_follow_the_baseline_schedule(tiny_data):
    # T_acq = 10: trainings at ticks 9, 19, 29, 39 -> 4 per node; each sends to k = 2 peers
    r = simulate(_cfg(), tiny_data, seed=0)
    assert (r.n_train_steps, r.n_messages, r.n_averages) == (24, 48, 24)
    assert r.t_first_average == 9
    assert r.params_sent == 48 * 431080
    assert r.eval_ticks.tolist() == [0, 20, 40]
    # R = 2: buffer of 2 * k = 4 models -> averaging every second training
    r2 = simulate(_cfg(interval_ratio=2), tiny_data, seed=0)
    assert (r2.n_averages, r2.t_first_average) == (12, 19)


def test_star_variant_hub_and_leaves(tiny_data):
    r = simulate(_cfg(topology="star"), tiny_data, seed=0)
    # Star(6): hub 0 with 5 leaves -> 10 directed edges; every node averages each round
    assert (r.n_messages, r.n_averages) == (40, 24)


def test_compression_sends_the_ratio_of_weights(tiny_data):
    r = simulate(_cfg(compression_ratio=0.25), tiny_data, seed=0)
    assert r.params_sent / (48 * 431080) == pytest.approx(0.25, abs=0.002)


def test_transfer_learning_variant_connects_peers_over_time(tiny_data):
    never = simulate(_cfg(transfer_threshold=1.0), tiny_data, seed=0)
    assert (never.n_messages, never.n_averages) == (0, 0)
    assert never.degree_mean.tolist() == [0.0, 0.0, 0.0]
    always = simulate(_cfg(transfer_threshold=0.0, eval_every=10), tiny_data, seed=0)
    deg = always.degree_mean
    assert deg[0] == 0.0 and deg[1] >= 1.0 and np.all(np.diff(deg) >= 0) and deg[-1] == 2.0


def test_asynchronous_acquisition_is_deterministic(tiny_data):
    a = simulate(_cfg(t_acquisition=(1, 19), averaging="variance_corrected"), tiny_data, seed=3)
    b = simulate(_cfg(t_acquisition=(1, 19), averaging="variance_corrected"), tiny_data, seed=3)
    assert np.array_equal(a.accuracy, b.accuracy) and a.n_train_steps == b.n_train_steps
    assert 6 * 2 <= a.n_train_steps <= 6 * 40


def test_variance_correction_keeps_layer_variance_while_plain_loses_it(tiny_data):
    plain = simulate(_cfg(beta=0.0, ticks=20, eval_every=20), tiny_data, seed=1)
    vc = simulate(_cfg(beta=0.0, ticks=20, eval_every=20, averaging="variance_corrected"), tiny_data, seed=1)
    # after averaging k = 2 independent models the plain variance is about halved (eq. (3))
    ratio_plain = plain.layer_variance_mean[-1] / plain.layer_variance_mean[0]
    ratio_vc = vc.layer_variance_mean[-1] / vc.layer_variance_mean[0]
    assert np.all(ratio_plain < 0.6) and np.all(ratio_vc > 0.9)


def test_expand_runs_grid_and_errors():
    cfg = {"benchmark": "vv", "simulation": {"n_nodes": 8, "degree": 2},
           "grid": {"interval_ratio": [1, 4], "t_acquisition": [10, [1, 19]]}}
    runs = expand_runs(cfg, rounds=7)
    assert len(runs) == 8 and all(c.ticks == 7 for _, _, c in runs)
    assert {c.t_acquisition for _, _, c in runs} == {10, (1, 19)}
    with pytest.raises(InputError, match="benchmark"):
        expand_runs({"benchmark": "sage"})
    with pytest.raises(InputError, match="beta"):
        expand_runs({"benchmark": "vv", "simulation": {"beta": 2.0}})
    with pytest.raises(InputError, match="degree|Regular"):
        expand_runs({"benchmark": "vv", "simulation": {"n_nodes": 5, "degree": 3}})


def test_a_field_the_chosen_setting_does_not_read_is_refused_unless_at_its_default():
    with pytest.raises(ValueError, match=r"simulation\.degree is used only with topology 'regular', not 'star'"):
        GossipConfig(topology="star", degree=3)
    with pytest.raises(ValueError, match=r"simulation\.alpha is used only with partition 'dirichlet', not 'iid'"):
        GossipConfig(partition="iid", alpha=0.05)
    with pytest.raises(ValueError, match=r"simulation\.own_subset is used only with transfer_threshold set, not None"):
        GossipConfig(own_subset=8)
    # at the default (as a dumped config lists it) or read by the setting: taken
    assert GossipConfig(topology="star", degree=8, alpha=0.5).degree == 8
    assert GossipConfig(partition="dirichlet", alpha=0.05, transfer_threshold="target", own_subset=8).alpha == 0.05


def test_expand_runs_applies_a_simulation_field_where_a_grid_cell_reads_it():
    cfg = {"benchmark": "vv", "simulation": {"n_nodes": 8, "degree": 2, "alpha": 0.1},
           "grid": {"partition": ["iid", "dirichlet"]}, "arms": [{"name": "a"}]}
    assert [(c.partition, c.alpha) for _, _, c in expand_runs(cfg)] == [("iid", 0.5), ("dirichlet", 0.1)]
    cfg["grid"] = {"interval_ratio": [1, 2]}                   # no run reads it: refused
    with pytest.raises(InputError, match=r"^vv config arm a \(grid cell interval_ratio=1\): simulation\.alpha is used"):
        expand_runs(cfg)
    arms = [{"name": "star", "topology": "star"}, {"name": "regular"}]
    with pytest.raises(InputError, match="arm star: simulation.degree is used only with topology 'regular'"):
        expand_runs({"benchmark": "vv", "simulation": {"n_nodes": 8}, "arms": [{"name": "star", "topology": "star",
                                                                                 "degree": 2}]})
    assert [c.degree for _, _, c in expand_runs({"benchmark": "vv", "simulation": {"n_nodes": 8, "degree": 2},
                                                "arms": arms})] == [8, 2]


def test_rounds_and_arms_do_not_silently_override_the_grid():
    with pytest.raises(InputError, match=r"^--rounds 2: grid.ticks \[4, 5\] sets the ticks of every run"):
        expand_runs({"benchmark": "vv", "grid": {"ticks": [4, 5]}}, rounds=2)
    assert [c.ticks for _, _, c in expand_runs({"benchmark": "vv", "grid": {"ticks": [4, 5]}})] == [4, 4, 5, 5]
    with pytest.raises(InputError, match=r"^vv config arm a: ticks is varied by grid.ticks \[4, 5\]"):
        expand_runs({"benchmark": "vv", "grid": {"ticks": [4, 5]}, "arms": [{"name": "a", "ticks": 6}]})
    with pytest.raises(InputError, match=r"^--rounds 3: arm a sets its own ticks"):
        expand_runs({"benchmark": "vv", "arms": [{"name": "a", "ticks": 6}]}, rounds=3)


def test_simulation_rejects_wrong_image_shape():
    rng = np.random.default_rng(0)
    bad = ImageDataset(rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 64),
                       rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 64), 10, "cifar")
    with pytest.raises(InputError, match="28x28"):
        simulate(_cfg(), bad, 0)


def test_transfer_learning_connects_on_the_acquisition_schedule(tiny_data):
    # Sec. III-C3: a node checks its own-data accuracy after each training step (ticks 9, 19, ...):
    # with threshold 0 every node has connected both its k = 2 waiting peers by the tick-20 evaluation.
    r = simulate(_cfg(transfer_threshold=0.0), tiny_data, seed=0)
    assert r.degree_mean.tolist() == [0.0, 2.0, 2.0]
    # The threshold tied to the reaching target keeps the paper's ratio 0.8 / 0.9.
    cfg = _cfg(transfer_threshold="target", target_accuracy=0.7)
    assert cfg.transfer_accuracy == pytest.approx(0.7 * 0.8 / 0.9)
    assert _cfg(transfer_threshold=0.8).transfer_accuracy == 0.8
    with pytest.raises(ValueError):
        _cfg(transfer_threshold=1.5)


def test_fl_server_and_global_broadcast_variants(tiny_data):
    # Fig. 8 reference: node 0 is a server that never trains; 5 clients train at ticks 9, 19, 29, 39,
    # send to the server, which averages the 5 and sends the global model back to all 5.
    fl = simulate(_cfg(topology="star", server=True, beta=0.0), tiny_data, seed=0)
    assert (fl.n_train_steps, fl.n_averages, fl.n_messages) == (20, 4, 20 + 4 * 5)
    assert np.all(fl.weight_diff[-1] == 0.0)        # every client holds the server's model
    # Fig. 6: a global broadcast of the average model before any training: all nodes identical at t = 0.
    bc = simulate(_cfg(topology="star", initial_model="broadcast_average"), tiny_data, seed=0)
    assert np.all(bc.weight_diff[0] == 0.0) and not np.all(fl.weight_diff[0] == 0.0)
    # eq. (3): the broadcast average of N = 6 independent Xavier draws has ~1/6 of their variance.
    ind = simulate(_cfg(topology="star"), tiny_data, seed=0)
    ratio = bc.layer_variance_mean[0] / ind.layer_variance_mean[0]
    assert np.all(np.abs(ratio - 1 / 6) < 0.03)
    with pytest.raises(ValueError, match="star"):
        _cfg(server=True)


def test_variance_correction_reaches_the_target_sooner_than_plain_averaging():
    """on a small real federation (Fashion-MNIST, N = 8 fully connected nodes,
    synchronous training every tick, model replacement beta = 0, independent Xavier initial
    models) plain averaging shrinks each layer's variance by ~1/8 per averaging (eq. (3)) and
    learns slowly; Algorithm 3 restores the variance. Reaching ticks of accuracy 0.2 on 200 test
    images (evaluated every 5 ticks), measured at seed 0: plain 20 / 20 (first / most), corrected
    10 / 10; the corrected run's mean accuracy at tick 10 is 0.389 against plain's 0.127."""
    assert FASHION_MNIST_DIR.is_dir(), "dataset-fashion-mnist missing (the Makefile installs it)"
    torch.set_num_threads(1)
    ds = load_idx_dataset()
    base = dict(n_nodes=8, degree=7, ticks=20, t_acquisition=1, eval_every=5, test_subset=200,
                target_accuracy=0.2, beta=0.0)
    plain = simulate(GossipConfig(**base, averaging="plain"), ds, seed=0)
    vc = simulate(GossipConfig(**base, averaging="variance_corrected"), ds, seed=0)
    assert (vc.first_reach, vc.most_reach) == (10, 10)
    assert (plain.first_reach, plain.most_reach) == (20, 20)
    assert vc.most_reach < plain.first_reach
    assert vc.accuracy[2].mean() == pytest.approx(0.389, abs=0.0015)
    assert plain.accuracy[2].mean() == pytest.approx(0.127, abs=0.0015)
