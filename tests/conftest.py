"""Shared fixtures: models with known posteriors and small data sets."""

from __future__ import annotations

import pyro
import pytest


@pytest.fixture(autouse=True)
def _seed_and_clear_param_store():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()
