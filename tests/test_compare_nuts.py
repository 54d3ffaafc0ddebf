"""The NUTS reference of ``pyro-sgmcmc compare``: its potential and its starting points.

NUTS runs on ``BayesianMLP.log_joint`` instead of Pyro's trace; these tests pin that the two
potentials agree (value and gradient) on the models ``compare`` builds, so the reference samples
the same posterior, and that each chain gets its own start, nearer a mode than a random point.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer.mcmc.util import initialize_model

from pyro_sgmcmc.cli.compare import CompareConfig, build_model, nuts_potential, nuts_starts
from pyro_sgmcmc.data.datasets import load_dataset


@pytest.mark.parametrize(
    ("dataset", "options"),
    [
        ("sinusoid", {}),
        ("sinusoid", {"noise": "halfnormal"}),
        ("linear", {"noise": "fixed", "prior": "scale_mixture"}),
        ("wine", {"prior": "gamma_precision", "hidden": (4,)}),
    ],
)
def test_nuts_potential_equals_pyros_trace_potential(dataset, options):
    """Whichever density ``nuts_potential`` picks, it is the model's own (value and gradient)."""
    data = load_dataset(dataset, seed=0)
    model = build_model(CompareConfig(dataset=dataset, out=None, **options), data)
    potential, transforms, source = nuts_potential(model, data)
    if options.get("prior") != "scale_mixture":
        assert source == "log_joint"  # the fast path, for the default models
    _, trace_potential, trace_transforms, _ = initialize_model(
        model, model_args=(data.x_train, data.y_train)
    )
    assert set(transforms) == set(trace_transforms)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        point, _, _, _ = initialize_model(model, model_args=(data.x_train, data.y_train))
        z = {
            name: (value + 0.3 * torch.randn(value.shape, generator=generator)).requires_grad_()
            for name, value in point.items()
        }
        ours, theirs = potential(z), trace_potential(z)
        assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5, abs=1e-3)
        grad_ours = torch.autograd.grad(ours, list(z.values()))
        grad_theirs = torch.autograd.grad(theirs, list(z.values()))
        for a, b in zip(grad_ours, grad_theirs, strict=True):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-3)


def test_each_chain_starts_from_its_own_point_near_a_mode():
    data = load_dataset("sinusoid", seed=0)
    model = build_model(CompareConfig(out=None), data)
    potential, _, _ = nuts_potential(model, data)
    pyro.set_rng_seed(3)
    random_starts = nuts_starts(model, data, potential, num_chains=3, num_steps=0)
    pyro.set_rng_seed(3)
    starts = nuts_starts(model, data, potential, num_chains=3, num_steps=200)
    weights = starts["layers.0.weight"]
    assert weights.shape == (3, 10, 1)
    assert not torch.allclose(weights[0], weights[1])
    for chain in range(3):
        before = potential({k: v[chain] for k, v in random_starts.items()})
        after = potential({k: v[chain] for k, v in starts.items()})
        assert float(after) < float(before) - 10.0
