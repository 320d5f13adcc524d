"""Shared fixtures: paths to the real open data in ../shared/data."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from etl.images import ImageDataset

REPO = Path(__file__).resolve().parents[1]

# `abps etl` records the project's latest cohort (cli/project.py); the tests' ETL runs go to a
# scratch record, never to the checkout's own .abps/state.json (subprocesses inherit this); the
# scratch folder is removed when this test process ends
_STATE_DIR = tempfile.mkdtemp(prefix="abps-test-state-")
atexit.register(shutil.rmtree, _STATE_DIR, ignore_errors=True)
os.environ["ABPS_STATE"] = os.path.join(_STATE_DIR, "state.json")
SHARED = Path(os.environ.get("ABPS_SHARED", REPO.parent / "shared"))
MIMIC_DEMO = SHARED / "data" / "mimic-iv-demo"
EICU_DEMO = SHARED / "data" / "eicu-demo"


@pytest.fixture(scope="session")
def mimic_demo_dir() -> Path:
    """The real MIMIC-IV demo v2.2 (CI has ../shared beside the clone)."""
    assert (MIMIC_DEMO / "icu" / "icustays.csv.gz").is_file(), f"MIMIC-IV demo not found at {MIMIC_DEMO}"
    return MIMIC_DEMO


@pytest.fixture(scope="session")
def eicu_demo_dir() -> Path:
    assert (EICU_DEMO / "patient.csv.gz").is_file(), f"eICU demo not found at {EICU_DEMO}"
    return EICU_DEMO


@pytest.fixture(scope="session")
def tiny_images():
    """A random 640 / 100 image set of 1x28x28 uint8 images, 10 classes (gossip and loop tests)."""
    rng = np.random.default_rng(0)
    return ImageDataset(rng.integers(0, 256, (640, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 640),
                        rng.integers(0, 256, (100, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 100),
                        10, "tiny")


@pytest.fixture
def step_inputs():
    """Factory ``make(eng, data, width=37)`` of one engine step's random inputs (step tests of the
    eager, autograd and fused paths): parameters ``p`` = the engine's initial draw + 0.05 N(0, 1),
    ``x`` [c, width, d], ``y`` [c, width] Bernoulli(0.3), ``real`` [c] real rows per center in
    1..width and ``rows`` [c, width] their mask; all from generator seed 0."""
    import types

    import torch

    def make(eng, data, width: int = 37):
        g = torch.Generator().manual_seed(0)
        p = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in eng.init_params().items()}
        c = data.n_centers
        x = torch.randn(c, width, data.d, generator=g)
        y = (torch.rand(c, width, generator=g) < 0.3).float()
        real = torch.randint(1, width + 1, (c,), generator=g)
        rows = torch.arange(width).unsqueeze(0) < real.unsqueeze(1)
        return types.SimpleNamespace(p=p, x=x, y=y, real=real, rows=rows, c=c, w=width, units=sum(eng.hidden))

    return make
