"""Shared fixtures: models with known posteriors and small data sets."""

from __future__ import annotations

import pyro
import pytest
import torch

# The test models are tiny: one intra-op thread is as fast, and it keeps the suite's run time
# stable on a shared or loaded machine (OpenMP threads spinning on busy cores slow torch down
# by an order of magnitude).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_clear_param_store():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


@pytest.fixture
def eager_log_joint(monkeypatch):
    """A model's ``log_joint`` differentiated by autograd at every call, never replayed from a
    recording: for test models that count or keep their calls (Python state a recorded graph
    does not see)."""
    from pyro_sgmcmc.models.potentials import LogJointPotential

    monkeypatch.setattr(
        LogJointPotential, "value_and_grad", LogJointPotential._autograd_value_and_grad
    )
