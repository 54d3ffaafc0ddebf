"""The functional path (one light handler, chains vectorised) equals Pyro's trace path."""

from __future__ import annotations

import itertools
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.mcmc.util import initialize_model
from pyro.nn import PyroModule, PyroSample
from pyro_tutorial_models import (
    BayesianRegression,
    DocsBNN,
    WeightsInsidePlate,
    binary_data,
    classification_data,
    grouped_data,
    logistic_regression,
    regression_data,
    varying_intercepts,
)
from torch import nn

from pyro_sgmcmc.engine.layout import FlatLayout
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.models.functional_potential import FunctionalPotential, LogDensity
from pyro_sgmcmc.models.potential_choice import make_potential
from pyro_sgmcmc.models.potentials import TracePotential
from pyro_sgmcmc.models.structure import inspect_model
from pyro_sgmcmc.nn import BayesianMLP


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _cases():
    return {
        "regression (a)": lambda: (BayesianRegression(3), regression_data()),
        "weights inside the plate (a)": lambda: (WeightsInsidePlate(3), regression_data()),
        "docs BNN (a)": lambda: (DocsBNN(3, 8, 3), classification_data()),
        "logistic, subsample_size (c)": lambda: (logistic_regression, binary_data()),
        "varying intercepts (b)": lambda: (varying_intercepts, grouped_data()),
        "BayesianMLP": lambda: (
            BayesianMLP(3, [8], 1),
            regression_data(),
        ),
    }


def _setup(model, data, num_chains, seed=0):
    """Both potentials of ``model`` and ``num_chains`` different starts (float64)."""
    structure = inspect_model(model, data, {})
    model = structure.model
    setup = structure.plate.bind_for_setup(model, data, {})
    starts = []
    for c in range(num_chains):
        pyro.set_rng_seed(seed + c)
        initial, _, transforms, _ = initialize_model(setup[0], setup[1], setup[2])
        starts.append(initial)
    start = {name: torch.stack([s[name] for s in starts]) for name in structure.latent_sites}
    layout = FlatLayout({name: value.shape[1:] for name, value in start.items()})
    base = (transforms, layout, structure.num_data)
    trace = TracePotential(model, data, {}, *base, plate=structure.plate)
    functional = FunctionalPotential(
        model, data, {}, *base, plate=structure.plate, sites=structure.sample_sites
    )
    return structure, trace, functional, layout.flatten(start)


def _rows(structure, num_chains, size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.stack(
        [torch.randperm(structure.num_data, generator=generator)[:size] for _ in range(num_chains)]
    )


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("vectorized", [True, False], ids=["vmap", "per-chain"])
def test_functional_equals_trace_value_and_gradient(float64, case, vectorized):
    model, data = _cases()[case]()
    data = tuple(d.double() if d.is_floating_point() else d for d in data if torch.is_tensor(d))
    if case.startswith("varying"):
        data = (data[0], 8, data[1])
    structure, trace, functional, flat = _setup(model, data, num_chains=3)
    functional.vectorized = vectorized
    size = structure.plate.subsample_size or 20
    rows = _rows(structure, 3, size)
    value_t, grad_t = trace.value_and_grad(flat, {}, rows)
    value_f, grad_f = functional.value_and_grad(flat, {}, rows)
    assert value_f.dtype == torch.float64
    torch.testing.assert_close(value_f, value_t, rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(grad_f, grad_t, rtol=1e-10, atol=1e-8)
    assert functional.vectorized == vectorized  # the vmap path was not given up
    assert functional.fallback is None


def test_functional_is_what_auto_picks_for_a_pyro_module():
    model, data = BayesianRegression(3), regression_data()
    structure = inspect_model(model, data, {})
    _, trace, _, flat = _setup(model, data, num_chains=2)
    chosen = make_potential(
        "auto", structure.model, data, {}, trace.transforms, trace.layout, structure.plate,
        trace.layout.unflatten(flat), structure.sample_sites,
    )  # fmt: skip
    assert isinstance(chosen, FunctionalPotential)


def test_full_data_in_chunks_equals_the_whole(float64):
    model, data = BayesianRegression(3), tuple(d.double() for d in regression_data(n=50))
    _, trace, functional, flat = _setup(model, data, num_chains=2)
    whole = trace.value_and_grad(flat, {}, None)
    chunked = functional.full_data_value_and_grad(flat, {}, chunk_size=16)
    torch.testing.assert_close(chunked[0], whole[0])
    torch.testing.assert_close(chunked[1], whole[1])


def test_subsampling_plate_with_fewer_rows_is_a_smaller_plate(float64):
    """Rows padded to the model's subsample_size and masked equal a plate of those rows."""
    x, y = (d.double() for d in binary_data(n=60))
    _, _, functional, flat = _setup(logistic_regression, (x, y), num_chains=2)
    rows = torch.tensor([[3, 7, 11], [0, 1, 59]])
    value, _ = functional.value_and_grad(flat, {}, rows)
    params = functional.layout.unflatten(flat)
    for c in range(2):
        w, b = params["w"][c], params["b"][c]
        logits = x[rows[c]] @ w + b
        expected = (
            dist.Normal(0.0, 1.0).log_prob(w).sum()
            + dist.Normal(0.0, 1.0).log_prob(b)
            + 60 / 3 * dist.Bernoulli(logits=logits).log_prob(y[rows[c]]).sum()
        )
        torch.testing.assert_close(value[c], -expected)


def _changing_structure(x, y=None):
    mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
    if float(mu.detach().abs()) > 10.0:  # never while sampling, but the code path exists
        pyro.sample("extra", dist.Normal(0.0, 1.0), obs=torch.tensor(0.5))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(mu * x, 1.0), obs=y)


def test_a_model_whose_structure_changes_falls_back_to_the_trace_path():
    x, y = torch.randn(40), torch.randn(40)
    structure, trace, functional, flat = _setup(_changing_structure, (x, y), num_chains=2)
    rows = _rows(structure, 2, 10)
    functional.value_and_grad(flat, {}, rows)
    assert functional.vectorized is False  # Python control flow on a value: one call per chain
    far = torch.full_like(flat, 20.0)
    with pytest.warns(SamplerWarning, match="structure changes between calls.*trace path"):
        value, _ = functional.value_and_grad(far, {}, rows)
    assert functional.fallback is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the notice is given once
        functional.value_and_grad(flat, {}, rows)
    torch.testing.assert_close(value, trace.value_and_grad(far, {}, rows)[0])


def test_log_density_weights_like_pyro():
    """One handler's total equals the trace's log_prob_sum, scale and mask included."""

    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        with (
            pyro.plate("data", 6, subsample_size=3) as idx,
            pyro.poutine.mask(mask=torch.tensor([True, False, True])),
        ):
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    y = torch.randn(6)
    structure = inspect_model(model, (y,), {})
    rows = torch.tensor([1, 4, 5])
    mu = torch.tensor(0.3)
    handler = LogDensity({"mu": mu}, structure.plate, rows)
    with handler:
        model(y)
    conditioned = pyro.poutine.condition(model, data={"mu": mu, "data": rows})
    expected = pyro.poutine.trace(conditioned).get_trace(y).log_prob_sum()
    torch.testing.assert_close(handler.total, expected)


@pytest.mark.parametrize("case", list(_cases()))
def test_later_calls_replay_a_recorded_graph_equal_to_the_trace_path(float64, case):
    """From the third call on the potential replays a graph recorded by ``make_fx`` (and the
    Gaussian priors of ``PyroSample`` sites come in closed form): the same values and gradients
    as Pyro's trace path, for every model, on new positions and rows."""
    model, data = _cases()[case]()
    data = tuple(d.double() if d.is_floating_point() else d for d in data if torch.is_tensor(d))
    if case.startswith("varying"):
        data = (data[0], 8, data[1])
    structure, trace, functional, flat = _setup(model, data, num_chains=3)
    size = structure.plate.subsample_size or 20
    for call in range(4):
        moved = flat + 0.1 * call
        rows = _rows(structure, 3, size, seed=call)
        value_t, grad_t = trace.value_and_grad(moved, {}, rows)
        value_f, grad_f = functional.value_and_grad(moved, {}, rows)
        torch.testing.assert_close(value_f, value_t, rtol=1e-10, atol=1e-8)
        torch.testing.assert_close(grad_f, grad_t, rtol=1e-10, atol=1e-8)
    assert functional.captured is not None and functional.captured.failure is None
    assert len(functional.captured.graphs) == 1  # one signature: one recording


def _recorded_regression():
    """The functional potential of Pyro's tutorial regression after its graph was recorded,
    with the graph, positions and rows for replays (float32, as users run it)."""
    model, data = BayesianRegression(3), regression_data()
    structure, _, functional, flat = _setup(model, data, num_chains=2)
    rows = _rows(structure, 2, 10)
    for _ in range(4):  # two to find the priors, one eager, one recording
        functional.value_and_grad(flat, {}, rows)
    return functional, flat, rows


def _record(captured, flat, rows):
    """Record the graph of this signature (its first call runs the eager function)."""
    for _ in range(2):
        captured(flat, {}, rows)
    assert len(captured.graphs) == 1


def test_a_signature_is_recorded_at_its_second_call():
    """A signature met once (e.g. a pass over the data's last, shorter chunk) is evaluated
    eagerly, not recorded; its second call records it, later calls replay the recording."""
    from pyro_sgmcmc.models import graph_capture

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 20, generator=generator)
    y = (torch.rand(1000, generator=generator) < 0.5).float()
    calls = []
    logistic = _logistic_value_and_grad(x, y)

    def function(flat, fixed, rows):
        calls.append(isinstance(flat, torch._subclasses.FakeTensor))
        return logistic(flat, fixed, rows)

    captured = graph_capture.CapturedGraph(function)
    flat = 0.1 * torch.randn(4, 20, generator=generator)
    rows = torch.randint(0, 1000, (4, 128), generator=generator)
    first = captured(flat, {}, rows)
    assert calls == [False] and captured.graphs == {}  # eager, nothing recorded
    captured(flat, {}, rows.flip(-1))
    assert calls == [False, True] and len(captured.graphs) == 1  # recorded on fake tensors
    captured(flat, {}, rows[:, :64])  # another signature: eager again
    assert calls == [False, True, False] and len(captured.graphs) == 1
    for first_bits, replay_bits in zip(first, captured(flat, {}, rows), strict=True):
        assert torch.equal(first_bits, replay_bits)
    assert calls == [False, True, False]  # a replay runs no Python of the function


def test_recorded_graphs_run_in_torchscript_with_the_same_bits(monkeypatch):
    """On the CPU a recorded graph is traced into TorchScript (its operations run from C++, two
    to three times faster for small models) only because its results equal the graph's in every
    bit: on new positions and rows too."""
    from pyro_sgmcmc.models import graph_capture

    functional, flat, rows = _recorded_regression()
    (replay,) = functional.captured.graphs.values()
    assert isinstance(replay, torch.jit.ScriptModule)
    captured = graph_capture.CapturedGraph(functional.captured.function)
    monkeypatch.setattr(graph_capture, "_interpreted", lambda graph, inputs: graph)  # FX itself
    _record(captured, flat, rows)
    (fx_graph,) = captured.graphs.values()
    assert isinstance(fx_graph, torch.fx.GraphModule)
    for call in range(5):
        moved = flat + 0.05 * call
        shifted = rows.roll(call, dims=-1)
        for first, second in zip(replay(shifted, moved), fx_graph(shifted, moved), strict=True):
            assert torch.equal(first, second)


def test_a_graph_torchscript_cannot_reproduce_is_replayed_as_recorded(monkeypatch):
    """Where tracing fails, or the traced graph differs in any bit, the FX graph is used."""
    from pyro_sgmcmc.models import graph_capture

    monkeypatch.setattr(torch.jit, "trace", lambda graph, inputs, **_: _raise())
    functional, *_ = _recorded_regression()
    assert isinstance(next(iter(functional.captured.graphs.values())), torch.fx.GraphModule)

    def off_by_one_ulp(graph, inputs, **_):
        return lambda *args: tuple(torch.nextafter(t, t + 1) for t in graph(*args))

    monkeypatch.setattr(torch.jit, "trace", off_by_one_ulp)
    functional, flat, rows = _recorded_regression()
    (replay,) = functional.captured.graphs.values()
    assert isinstance(replay, torch.fx.GraphModule)
    assert graph_capture._identical((flat, [rows]), (flat.clone(), [rows.clone()]))
    assert not graph_capture._identical((flat,), (flat, flat))


def test_a_networks_closed_form_gradient_is_replayed_with_the_same_bits():
    """``BayesianMLP``'s hand-written gradient runs eagerly for its first calls, then from a
    recorded graph (TorchScript on the CPU): equal in every bit to the eager closed form."""
    from pyro_sgmcmc.models.potentials import ClosedFormPotential

    model, data = BayesianMLP(3, [8], 1), regression_data()
    structure, *_ = _setup(model, data, num_chains=2)
    model = structure.model
    setup = structure.plate.bind_for_setup(model, data, {})
    pyro.set_rng_seed(0)
    initial, _, transforms, _ = initialize_model(setup[0], setup[1], setup[2])
    start = {name: torch.stack([value, 0.5 * value]) for name, value in initial.items()}
    layout = FlatLayout({name: value.shape[1:] for name, value in start.items()})
    potential = make_potential("auto", model, data, {}, transforms, layout, structure.plate,
                               start)  # fmt: skip
    assert isinstance(potential, ClosedFormPotential)
    flat = layout.flatten(start)
    for call in range(5):
        moved, rows = flat + 0.1 * call, _rows(structure, 2, 10, seed=call)
        value, grad = potential.value_and_grad(moved, {}, rows)
        eager_value, eager_grad = potential._closed_form(moved, {}, rows)
        assert torch.equal(value, eager_value) and torch.equal(grad, eager_grad)
    (replay,) = potential.captured.graphs.values()
    assert isinstance(replay, torch.jit.ScriptModule)


def _logistic_value_and_grad(x, y):
    """A hand-written minibatch potential of a logistic regression whose predictor and
    gradient are batched matrix-vector products (``(C, B, D) @ (C, D, 1)`` and back)."""

    def value_and_grad(flat, fixed, rows):
        inputs, labels = x[rows], y[rows]
        logits = torch.bmm(inputs, flat.unsqueeze(-1)).squeeze(-1)
        value = (torch.nn.functional.softplus(logits) - labels * logits).sum(-1)
        residual = (torch.sigmoid(logits) - labels).unsqueeze(-1)
        return value, torch.bmm(inputs.transpose(1, 2), residual).squeeze(-1)

    return value_and_grad


def _recorded_logistic(monkeypatch, same_bits):
    """A logistic potential (4 chains, batches of 128 of 20 features) recorded with the
    row-vector rewrite's bit check answering ``same_bits`` (or its calls, one per product);
    the graph, its eager function and inputs for replays."""
    from pyro_sgmcmc.models import graph_capture

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 20, generator=generator)
    y = (torch.rand(1000, generator=generator) < 0.5).float()
    function = _logistic_value_and_grad(x, y)
    monkeypatch.setattr(graph_capture, "_interpreted", lambda graph, inputs: graph)
    answer = same_bits if callable(same_bits) else lambda: same_bits
    monkeypatch.setattr(graph_capture, "_identical", lambda first, second: answer())
    captured = graph_capture.CapturedGraph(function)
    flat = 0.1 * torch.randn(4, 20, generator=generator)
    rows = torch.randint(0, 1000, (4, 128), generator=generator)
    _record(captured, flat, rows)
    monkeypatch.undo()
    (graph,) = captured.graphs.values()
    return graph, function, flat, rows


def _products(graph):
    """The ``bmm`` nodes of a graph, each as the shapes of its two operands (a rewritten
    product multiplies ``(C, 1, K)`` row vectors)."""
    return [
        [tuple(arg.meta["val"].shape) for arg in node.args]
        for node in graph.graph.nodes
        if node.target is torch.ops.aten.bmm.default
    ]


REWRITTEN = [[(4, 1, 20), (4, 20, 128)], [(4, 1, 128), (4, 128, 20)]]


def test_batched_matrix_vector_products_are_replayed_as_row_vector_products(monkeypatch):
    """``bmm`` of several chains' ``(M, K)`` matrices by ``(K, 1)`` columns, slow on the CPU, is
    recorded as the transpose of row vectors times the transposed matrices: the same values."""
    graph, function, flat, rows = _recorded_logistic(monkeypatch, same_bits=True)
    assert _products(graph) == REWRITTEN  # both rewritten
    for call in range(3):
        moved, shifted = flat + 0.05 * call, rows.roll(call, dims=-1)
        for replay, eager in zip(graph(shifted, moved), function(moved, {}, shifted), strict=True):
            torch.testing.assert_close(replay, eager, rtol=1e-5, atol=1e-5)


def test_a_row_vector_product_that_rounds_differently_is_not_used(monkeypatch):
    """The rewrite is kept only where it gives the eager computation's bits on the recording
    call: otherwise the graph keeps the products as recorded."""
    graph, *_ = _recorded_logistic(monkeypatch, same_bits=False)
    assert _products(graph) == [[(4, 128, 20), (4, 20, 1)], [(4, 20, 128), (4, 128, 1)]]


def test_each_product_is_kept_or_refused_on_its_own(monkeypatch):
    """A product whose rewrite rounds differently (e.g. one by ``nn.Linear``'s transposed
    weight) does not take the others' rewrites with it: here the check accepts the first
    product's rewrite and refuses the second's."""
    answers = itertools.chain([True, False], itertools.repeat(True))  # then the simplification's
    graph, *_ = _recorded_logistic(monkeypatch, same_bits=lambda: next(answers))
    assert _products(graph) == [REWRITTEN[0], [(4, 20, 128), (4, 128, 1)]]


def test_replays_keep_the_eager_bits_whichever_product_is_used():
    """On this CPU, whether or not the rewrite was kept: replays equal the eager potential in
    every bit, on new positions and rows."""
    from pyro_sgmcmc.models import graph_capture

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2000, 20, generator=generator)
    y = (torch.rand(2000, generator=generator) < 0.5).float()
    function = _logistic_value_and_grad(x, y)
    captured = graph_capture.CapturedGraph(function)
    for _ in range(4):
        flat = torch.randn(4, 20, generator=generator)
        rows = torch.randint(0, 2000, (4, 500), generator=generator)
        replay = captured(flat, {}, rows)
        for first, second in zip(replay, function(flat, {}, rows), strict=True):
            assert torch.equal(first, second)


def test_graphs_off_the_cpu_keep_their_products(monkeypatch):
    """The rewrite was measured on the CPU: a graph whose inputs live elsewhere is left as
    recorded (here on the ``meta`` device, which any machine has), even where the bits agree."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from pyro_sgmcmc.models import graph_capture
    from pyro_sgmcmc.models.graph_capture import _with_row_vector_products

    monkeypatch.setattr(graph_capture, "_identical", lambda first, second: True)
    left, right = torch.ones(4, 500, 20, device="meta"), torch.ones(4, 20, 1, device="meta")
    graph = make_fx(torch.bmm, tracing_mode="fake")(left, right)
    assert _with_row_vector_products(graph, (left, right)) is graph


def test_only_slow_matrix_vector_products_are_chosen():
    """One chain, matrices of under 8,192 entries in all, or more than one column: left as
    recorded."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from pyro_sgmcmc.models.graph_capture import _is_slow_matrix_vector

    def chosen(left, right):
        graph = make_fx(torch.bmm, tracing_mode="fake")(torch.ones(left), torch.ones(right))
        (node,) = [n for n in graph.graph.nodes if n.target is torch.ops.aten.bmm.default]
        return _is_slow_matrix_vector(node)

    assert chosen((4, 500, 20), (4, 20, 1))
    assert chosen((4, 32, 100), (4, 100, 1))
    assert not chosen((1, 500, 20), (1, 20, 1))  # one chain: PyTorch's own kernel is fast
    assert not chosen((4, 32, 50), (4, 50, 1))  # 6,400 entries
    assert not chosen((4, 500, 20), (4, 20, 2))


def _raise():
    raise RuntimeError("TorchScript cannot hold this graph")


def test_a_pickled_potential_records_its_graphs_again():
    """TorchScript graphs do not pickle: a copy of the potential drops them and records anew,
    with the same results."""
    import pickle

    functional, flat, rows = _recorded_regression()
    copy = pickle.loads(pickle.dumps(functional.captured))
    assert copy.graphs == {} and len(functional.captured.graphs) == 1
    for first, second in zip(
        copy(flat, {}, rows), functional.captured(flat, {}, rows), strict=True
    ):
        assert torch.equal(first, second)


def test_the_closed_form_prior_covers_pyro_sample_priors_only(float64):
    """``PyroSample`` priors are the same object at every call: covered. A prior built anew at
    every call (a hand-written model) or depending on another latent value is not."""
    model, data = DocsBNN(3, 8, 3), classification_data()
    data = tuple(d.double() if d.is_floating_point() else d for d in data)
    structure, _, functional, flat = _setup(model, data, num_chains=2)
    rows = _rows(structure, 2, 20)
    for _ in range(2):
        functional.value_and_grad(flat, {}, rows)
    prior = functional.gaussian_prior
    assert set(prior.sites) == set(functional.layout.names)
    assert prior.loc is None and prior.precision == 1.0  # N(0, 1): the gradient is the position

    x, y = (d.double() for d in regression_data())
    _, _, hand_written, flat = _setup(BayesianRegression(3), (x, y), num_chains=2)
    hand_written.value_and_grad(flat, {}, None)
    hand_written.value_and_grad(flat, {}, None)
    # the weights are PyroSample priors; sigma ~ Uniform is not a Normal
    assert set(hand_written.gaussian_prior.sites) == {"linear.weight", "linear.bias"}

    group, num_groups, yg = grouped_data()
    _, _, built, flat = _setup(varying_intercepts, (group, num_groups, yg.double()), 2)
    built.value_and_grad(flat, {}, None)
    built.value_and_grad(flat, {}, None)
    assert built.gaussian_prior is False  # every prior is built anew at each call

    _, trace, hierarchical, flat = _setup(HierarchicalScale(3), (x, y), num_chains=2)
    for call in range(3):
        value, grad = hierarchical.value_and_grad(flat + 0.1 * call, {}, None)
    assert set(hierarchical.gaussian_prior.sites) == {"linear.bias"}  # the weight's scale is tau
    expected = trace.value_and_grad(flat + 0.2, {}, None)
    torch.testing.assert_close(value, expected[0])
    torch.testing.assert_close(grad, expected[1])


class HierarchicalScale(PyroModule):
    """Weights whose prior scale is another latent site (a callable ``PyroSample``)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.tau = PyroSample(dist.HalfNormal(1.0))
        self.linear = PyroModule[nn.Linear](in_features, 1)
        self.linear.weight = PyroSample(
            lambda module: dist.Normal(0.0, self.tau).expand([1, in_features]).to_event(2)
        )
        self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([1]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, 1.0), obs=y)
        return mean


def test_a_model_that_cannot_be_recorded_stays_eager_and_right(float64):
    """Python control flow on a latent value cannot be recorded on fake tensors: the potential
    keeps evaluating eagerly (and still notices a change of structure)."""
    x, y = torch.randn(40, dtype=torch.float64), torch.randn(40, dtype=torch.float64)
    structure, trace, functional, flat = _setup(_changing_structure, (x, y), num_chains=1)
    rows = _rows(structure, 1, 10)
    for _ in range(4):  # two to find the priors, one eager, one recording
        value, _ = functional.value_and_grad(flat, {}, rows)
    assert "data-dependent" in functional.captured.failure
    torch.testing.assert_close(value, trace.value_and_grad(flat, {}, rows)[0])
    far = torch.full_like(flat, 20.0)
    with pytest.warns(SamplerWarning, match="structure changes between calls"):
        functional.value_and_grad(far, {}, rows)
