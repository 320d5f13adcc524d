"""Gossip learning with variance-corrected model averaging (Tian et al., arXiv 2404.04616).

* :mod:`federation.gossip.model` - stacked LeNet-5 (Caffe form), SGD, "inv" learning rate;
* :mod:`federation.core.variance` (core, shared with the clinical runtime) - Algorithm 3 and :func:`variance_corrected_mix`, the
  reusable aggregation transform on stacked parameters and a mixing matrix;
* :mod:`federation.gossip.simulation` - the tick-based simulation (Sec. III-A, III-C variants);
* :mod:`federation.gossip.metrics` - plateau delay (eq. (2)), reaching times, weight difference;
* :mod:`federation.gossip.runner` - :func:`cli_run`, the ``benchmark: vv`` entry point.

See docs/gossip.md.
"""

from federation.core.variance import variance_corrected_average, variance_corrected_mix
from federation.gossip.metrics import plateau_delay, reaching_times, weight_difference
from federation.gossip.runner import cli_run, compare, expand_runs
from federation.gossip.simulation import GossipConfig, GossipResult, simulate

__all__ = ["GossipConfig", "GossipResult", "cli_run", "compare", "expand_runs", "plateau_delay",
           "reaching_times", "simulate", "variance_corrected_average", "variance_corrected_mix",
           "weight_difference"]
