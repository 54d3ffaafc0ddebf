"""A network's hidden units held far outside their prior at the planned end of warm-up are
started afresh (incoming weights and bias from the prior, outgoing weights zero) and the warm-up
goes on; other units, and models without hidden units, are left as they are."""

from __future__ import annotations

import warnings

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from test_prior_distance import _network_and_prior_draws

from pyro_sgmcmc import SGHMC, run_chains
from pyro_sgmcmc.engine import prepare_chains, unit_restart
from pyro_sgmcmc.engine.prior_distance import FAR_FROM_PRIOR
from pyro_sgmcmc.engine.unit_restart import (
    Restart,
    UnitRestart,
    other_layer_sites,
    units_to_restart,
)
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.models.structure import GlobalSitesFirst, inspect_model
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood


def _forward(values, x):
    hidden = torch.relu(x @ values["layers.0.weight"].T + values["layers.0.bias"])
    return hidden @ values["layers.1.weight"].T + values["layers.1.bias"]


def test_a_unit_far_outside_its_prior_is_started_afresh():
    """Per chain, the restart finds the hidden units whose incoming weight or bias lies beyond
    the bound, and starts each afresh: incoming weights and bias drawn from the prior, outgoing
    weights zero. A unit switched off on every row leaves the network's function unchanged."""
    model, args, plate, draws = _network_and_prior_draws()
    position = {name: value[:, 0] for name, value in draws.items()}  # (2, ...) per site
    restart = UnitRestart(model, args, {}, plate, dict, dict)
    generators = [torch.Generator().manual_seed(c) for c in range(2)]
    assert [r.units for r in restart(position, generators)] == [0, 0]  # noise: not judged
    position["layers.0.bias"][1, 3] = -2.0 * FAR_FROM_PRIOR - 0.01  # off on every row
    position["layers.0.weight"][0, 5, 0] = 2.0 * FAR_FROM_PRIOR - 0.01  # just inside
    position["layers.1.weight"][0, 0, 4] = 2.0 * FAR_FROM_PRIOR + 0.01  # outgoing: not reset
    first, second = restart(position, generators)
    assert (first.units, second.units) == (0, 1)
    first, second = first.values, second.values
    assert first == {} and sorted(second) == ["layers.0.bias", "layers.0.weight", "layers.1.weight"]
    dead = torch.tensor([i == 3 for i in range(8)])
    mask, new = second["layers.1.weight"]
    assert torch.equal(mask, dead[None, :]) and bool((new[mask] == 0).all())
    mask, new = second["layers.0.weight"]
    assert torch.equal(mask, dead[:, None].expand(8, 3)) and bool((new[mask].abs() < 8.0).all())
    chain = {name: value[1] for name, value in position.items()}
    started = {name: torch.where(*second[name], chain[name]) if name in second else chain[name]
               for name in chain}  # fmt: skip
    assert started["layers.0.bias"][3].abs() < 8.0  # drawn from N(0, 2^2)
    x = torch.randn(100, 3, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(_forward(started, x), _forward(chain, x))
    # an incoming weight far out: its unit is started afresh too
    position["layers.0.weight"][0, 6, 2] = 2.0 * FAR_FROM_PRIOR + 0.01
    mask, _ = restart(position, generators)[0].values["layers.1.weight"]
    assert mask[0].tolist() == [i == 6 for i in range(8)]


def test_units_of_two_layers_of_one_width_are_restarted_into_the_next_layer():
    """A 3-5-5-1 network: a unit of each hidden layer far out. Each is restarted into the layer
    that follows it in the model's order (not the last one, which takes 5 units too), and a
    weight both redrawn (its unit restarted) and silenced (it reads a restarted unit) is zero."""
    shapes = {"layers.0.weight": (5, 3), "layers.0.bias": (5,), "layers.1.weight": (5, 5),
              "layers.1.bias": (5,), "layers.2.weight": (1, 5), "layers.2.bias": (1,)}  # fmt: skip
    values = {name: torch.ones(shape) for name, shape in shapes.items()}
    distances = {name: (torch.zeros(shape), torch.zeros(shape), torch.ones(shape))
                 for name, shape in shapes.items()}  # fmt: skip
    distances["layers.0.bias"][0][2] = FAR_FROM_PRIOR + 1.0
    distances["layers.1.weight"][0][4, 0] = FAR_FROM_PRIOR + 1.0
    restart = units_to_restart(values, distances, torch.Generator().manual_seed(0))
    assert restart.units == 2 and sorted(restart.values) == sorted(set(shapes) - {"layers.2.bias"})
    mask, new = restart.values["layers.1.weight"]
    expected = torch.zeros(5, 5, dtype=torch.bool)
    expected[:, 2], expected[4, :] = True, True
    assert torch.equal(mask, expected)
    assert bool((new[:, 2] == 0).all()) and bool((new[4, [0, 1, 3, 4]] != 0).all())
    mask, new = restart.values["layers.2.weight"]
    assert mask.tolist() == [[False] * 4 + [True]] and float(new[0, 4]) == 0.0
    # a layer with a site not real-valued (here its outgoing weight) is left as it is
    real = set(shapes) - {"layers.2.weight"}
    restart = units_to_restart(values, distances, torch.Generator().manual_seed(0), real)
    assert restart.units == 1 and "layers.2.weight" not in restart.values
    assert "layers.1.bias" not in restart.values  # the unit of layer 1 is not restarted


def _warmup_steps(monkeypatch, bound: float) -> list[tuple[int, int]]:
    """Per chain of a small ReLU network's run, with coordinates beyond ``bound`` prior sds
    counted far: the warm-up's gradient steps and the units started afresh."""
    monkeypatch.setattr(unit_restart, "FAR_FROM_PRIOR", bound)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(200, 2, generator=generator)
    y = torch.relu(x[:, 0]) + 0.1 * torch.randn(200, generator=generator)
    model = BayesianMLP(2, [8], 1, activation="relu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)
        result = run_chains(SGHMC(model, batch_size=50, seed=2), x, y, num_chains=2,
                            num_samples=10, warmup_steps=120)  # fmt: skip
    return [(r["warmup_gradient_steps"], r["restarted_units"]) for r in result.chain_reports]


def test_units_started_afresh_at_the_end_of_warmup_warm_up_once_more(monkeypatch):
    """Where some chain's units are started afresh at the planned end of warm-up, the chains
    warm up once more, as long again, and only once (here the bound is set so low that every
    unit is beyond it, again after); where none is, the warm-up is as planned."""
    planned = _warmup_steps(monkeypatch, 1e6)
    assert [units for _, units in planned] == [0, 0]
    restarted = _warmup_steps(monkeypatch, 0.1)
    assert [steps for steps, _ in restarted] == [2 * steps for steps, _ in planned]
    assert [units for _, units in restarted] == [8, 8]  # every unit, once


def test_a_restart_leaves_the_sites_of_gibbs_blocks_to_them():
    """The engine restarts the moving sites a restart names and leaves a site that a Gibbs block
    draws (here the noise precision, named as if it were a unit's) as it is."""
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(60, 2, generator=generator), torch.randn(60, generator=generator)
    likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 0.5))
    model = BayesianMLP(2, [4], 1, activation="relu", likelihood=likelihood)
    sampler = SGHMC(model, batch_size=20, seed=0)
    chains = prepare_chains(sampler.settings, sampler.rule, sampler.options, sampler.model,
                            (x, y), {}, chains=[0], warmup_draws=60)  # fmt: skip
    engine = chains.engine
    assert "noise_precision" in engine.fixed
    before = {name: value.clone() for name, value in engine.current_values().items()}
    bias = torch.tensor([True, False, False, False])
    restart = Restart({"layers.0.bias": (bias, torch.full((4,), 0.5)),
                       "noise_precision": (torch.tensor(True), torch.tensor(9.0))}, 1)  # fmt: skip
    engine._restart_units([restart])
    after = engine.current_values()
    assert after["layers.0.bias"][0].tolist()[0] == 0.5
    assert torch.equal(after["layers.0.bias"][0, 1:], before["layers.0.bias"][0, 1:])
    assert torch.equal(after["noise_precision"], before["noise_precision"])
    assert engine.restarted_units == [1]
    # the restarted state is where a chain stuck in the new windows goes back to
    anchor = engine.layout.unflatten(engine.anchor["state"].position["z"])
    assert torch.equal(anchor["layers.0.bias"], after["layers.0.bias"])
    # and a checkpoint keeps the count
    state = engine.state_dict()
    engine.restarted_units = [0]
    engine.load_state_dict(state)
    assert engine.restarted_units == [1]


class _Rescale(PyroModule):
    """A layer of another kind than ``torch.nn.Linear`` with its site names and shapes: a
    ``(units, inputs)`` ``weight`` and a ``(units,)`` ``bias``, used elementwise."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([width, width]).to_event(2))
        self.bias = PyroSample(dist.Normal(0.0, 1.0).expand([width]).to_event(1))

    def forward(self, x):
        return x * self.weight.diagonal() + self.bias


class _Net(PyroModule):
    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self.first = _Rescale(4)
        self.second = PyroModule[torch.nn.Linear](4, 4)
        self.second.weight = PyroSample(dist.Normal(0.0, 1.0).expand([4, 4]).to_event(2))
        self.second.bias = PyroSample(dist.Normal(0.0, 1.0).expand([4]).to_event(1))
        self.last = PyroModule[torch.nn.Linear](4, 1)
        self.last.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 4]).to_event(2))

    def forward(self, x):
        return self.last(torch.relu(self.second(self.first(x))))


def test_a_layer_of_another_kind_in_a_pyro_module_is_not_restarted():
    """Where a layer's weight is that of a ``PyroModule`` other than ``torch.nn.Linear``, the
    layer is left as it is whatever its names and shapes (the names of a named root, or of a
    network held by a plain ``torch.nn.Module``, are Pyro's); sites of no module keep the
    names-and-shapes rule."""
    assert other_layer_sites(_Net()) == {"first.weight", "weight"}  # the root is a PyroModule
    assert other_layer_sites(_Net("net")) == {"net.first.weight", "net.weight"}
    holder = torch.nn.Module()
    holder.net = _Net()
    assert other_layer_sites(holder) == {"first.weight", "weight"}  # as Pyro names them
    assert other_layer_sites(_forward) == frozenset()
    assert other_layer_sites(GlobalSitesFirst(_Net())) == {"first.weight", "weight"}
    shapes = {"first.weight": (4, 4), "first.bias": (4,), "second.weight": (4, 4),
              "second.bias": (4,), "last.weight": (1, 4)}  # fmt: skip
    values = {name: torch.ones(shape) for name, shape in shapes.items()}
    distances = {name: (torch.full(shape, FAR_FROM_PRIOR + 1.0), torch.zeros(shape),
                        torch.ones(shape)) for name, shape in shapes.items()}  # fmt: skip
    every = units_to_restart(values, distances, torch.Generator().manual_seed(0))
    assert every.units == 8  # by names and shapes, both layers
    other = other_layer_sites(_Net())
    only = units_to_restart(values, distances, torch.Generator().manual_seed(0), None, other)
    assert only.units == 4
    assert sorted(only.values) == ["last.weight", "second.bias", "second.weight"]
    # the engine's restart of a BayesianMLP judges both its layers
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(1))
    model = BayesianMLP(4, [6], 1, activation="relu")
    structure = inspect_model(model, (x, torch.randn(30)), {})
    restart = UnitRestart(structure.model, (x, torch.randn(30)), {}, structure.plate, dict, dict)
    assert not {"layers.0.weight", "layers.1.weight"} & restart.other_layers
