"""Simplifying a recorded graph: fewer operations, the same bits, nothing that changes a result."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from pyro_sgmcmc.models import graph_capture, graph_simplify
from pyro_sgmcmc.models.graph_simplify import simplified

aten = torch.ops.aten


def _operations(graph: torch.fx.GraphModule) -> list:
    return [node.target for node in graph.graph.nodes if node.op == "call_function"]


def _recorded(function, *inputs):
    return make_fx(function, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)


def _equal(first, second) -> bool:
    return graph_capture._identical(tuple(first), tuple(second))


def _logistic_potential(x, y):
    """A minibatch potential written as a Pyro model's is computed: distributions' log-densities,
    a plate's scale, and autograd for the gradient (forward and backward pass recorded)."""

    def value_and_grad(flat, fixed, rows):
        with torch.enable_grad():
            w = flat.detach().requires_grad_()
            prior = torch.distributions.Normal(0.0, 1.0, validate_args=False).log_prob(w).sum(-1)
            logits = torch.bmm(x[rows], w.unsqueeze(-1)).squeeze(-1)
            data = (
                torch.distributions.Bernoulli(logits=logits, validate_args=False)
                .log_prob(y[rows])
                .sum(-1)
            )
            value = -(prior * 1.0 + 0.0 + data * (x.shape[0] / rows.shape[1]))
            (grad,) = torch.autograd.grad(value.sum(), w)
        return value.detach(), grad

    return value_and_grad


def _captured_logistic(monkeypatch, simplify: bool):
    """The FX graph ``CapturedGraph`` records of the logistic potential (4 chains, batches of
    128 of 20 features), simplified or not; the eager function and inputs for replays."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 20, generator=generator)
    y = (torch.rand(1000, generator=generator) < 0.5).float()
    function = _logistic_potential(x, y)
    monkeypatch.setattr(graph_capture, "_interpreted", lambda graph, inputs: graph)
    if not simplify:
        monkeypatch.setattr(graph_capture, "simplified", lambda graph, inputs, same: graph)
    captured = graph_capture.CapturedGraph(function)
    flat = 0.1 * torch.randn(4, 20, generator=generator)
    rows = torch.randint(0, 1000, (4, 128), generator=generator)
    for _ in range(2):
        captured(flat, {}, rows)
    monkeypatch.undo()
    (graph,) = captured.graphs.values()
    return graph, function, flat, rows


def test_a_pyro_style_potential_loses_a_third_of_its_operations_and_no_bit(monkeypatch):
    """Prior constants folded, the seed gradient's ones folded, ``* 1.0``, ``+ 0.0`` and views
    to the same shape removed: at least a third fewer operations, and on new positions and rows
    the replay equals the eager function in every bit."""
    recorded, *_ = _captured_logistic(monkeypatch, simplify=False)
    graph, function, flat, rows = _captured_logistic(monkeypatch, simplify=True)
    assert len(_operations(graph)) <= 2 / 3 * len(_operations(recorded))
    constants = [node.target for node in graph.graph.nodes if node.op == "get_attr"]
    assert any(name.startswith("_folded_") for name in constants)
    for call in range(5):
        moved, shifted = flat + 0.05 * call, rows.roll(call, dims=-1)
        assert _equal(graph(shifted, moved), function(moved, {}, shifted))


def test_a_value_written_in_place_later_is_not_replaced():
    """``b = a * 1`` is not ``a`` where ``a`` is modified in place after ``b`` is computed."""

    def function(x):
        a = x.clone()
        b = a * 1
        a.add_(1)
        return b, a

    x = torch.randn(5)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    new = torch.randn(5)
    assert _equal(graph(new), function(new))


def test_a_constant_written_in_place_is_not_folded():
    """A constant the graph modifies in place is computed at every replay: folded, it would keep
    the first call's modification and add the next call's to it."""

    def function(x):
        total = torch.zeros(3)
        total.add_(x.sum())
        return (total * 1.0,)

    x = torch.randn(4)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    for _ in range(3):
        new = torch.randn(4)
        assert _equal(graph(new), function(new))


def test_random_operations_stay_in_the_graph():
    """A random draw without inputs is not a constant: it is drawn at every replay."""

    def function(x):
        return (x + torch.rand(3) * 1.0,)

    x = torch.zeros(3)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    assert aten.rand.default in _operations(graph)
    assert not torch.equal(graph(x)[0], graph(x)[0])


def test_an_operation_of_a_shape_only_is_folded():
    """``ones_like(x)`` depends on ``x``'s shape only: it becomes a constant."""

    def function(x):
        return (x * torch.ones_like(x) + x,)

    x = torch.randn(3, 2)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    assert aten.ones_like.default not in _operations(graph)
    assert aten.mul.Tensor not in _operations(graph)
    new = torch.randn(3, 2)
    assert _equal(graph(new), function(new))


def test_a_large_computed_constant_is_left_to_the_replay():
    """A computation on a large constant (a data set scaled in the model) is not folded into a
    second copy of the data."""
    data = torch.randn(graph_simplify.FOLD_MAX_ELEMENTS + 1)

    def function(x):
        return ((data * 2.0)[:3] + x,)

    x = torch.randn(3)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    assert aten.mul.Tensor in _operations(graph)
    assert _equal(graph(x), function(x))


@pytest.mark.parametrize("answer", [False, "raises"])
def test_a_simplification_that_changes_a_bit_is_not_used(answer):
    """Where the simplified graph's results differ from the recording's in any bit, or the
    comparison fails, the recorded graph is kept (only its copies of constants removed)."""

    def function(x):
        return (x * 1.0 + torch.ones(2).sum(),)

    def judge(first, second):
        if answer == "raises":
            raise RuntimeError("cannot compare")
        return answer

    x = torch.randn(2)
    recorded = _recorded(function, x)
    kept = simplified(recorded, (x,), judge)
    assert kept is recorded
    assert aten.ones.default in _operations(kept) and aten.mul.Tensor in _operations(kept)


def test_results_stay_fresh_tensors():
    """A returned ``x * 1`` is not ``x`` itself, and a returned constant is computed at every
    call: a caller that modifies a result in place modifies neither its input nor the graph."""

    def function(x):
        return x * 1.0, torch.ones(3) * 2.0

    x = torch.randn(3)
    graph = simplified(_recorded(function, x), (x,), graph_capture._identical)
    new = torch.randn(3)
    same, constant = graph(new)
    assert same.data_ptr() != new.data_ptr()
    constant.add_(1.0)
    assert torch.equal(graph(new)[1], torch.full((3,), 2.0))
