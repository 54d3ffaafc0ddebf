"""How the engine recovers a chain: the Gibbs redraw after the divergence check, going back to
the warm-up's anchor, and the power iteration that bounds the stiffest direction.

Found on the UCI energy benchmark (split 7): a step that blew a network up, taken together with
a Gibbs redraw of the noise precision, had the redraw computed at the blown-up weights (a
precision near zero, from huge residuals), which made the blown-up network look quiet to the
divergence check; the chain then sat there with no warning. The check now judges the move
first, and the conditional is drawn where the chain is after that judgement.
"""

from __future__ import annotations

import torch

from pyro_sgmcmc import PSGLD, SGHMC
from pyro_sgmcmc.engine.adaptation import COLLAPSE, _power_iteration
from pyro_sgmcmc.engine.build import prepare_chains
from pyro_sgmcmc.engine.engine import FLAT
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision, NormalLikelihood, NormalPrior


def _regression():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(500, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(500, generator=generator)
    likelihood = NormalLikelihood(precision=GammaPrecision(2.0, 0.5))
    model = BayesianMLP(3, [10], 1, activation="relu", likelihood=likelihood,
                        prior=NormalPrior(1.0))  # fmt: skip
    return model, x, y


def _engine(num_chains: int, kernel_class=SGHMC, **options):
    model, x, y = _regression()
    kernel = kernel_class(model, step_size=1e-5, batch_size=50, seed=1, **options)
    prepared = prepare_chains(kernel.settings, kernel.rule, kernel.options, model, (x, y), {},
                              chains=list(range(num_chains)), warmup_draws=0)  # fmt: skip
    return prepared.engine


def _kick(engine, chains: list[int], size: float) -> None:
    """Give the listed chains a momentum that moves every coordinate by ``size`` next step."""
    momentum = engine.state.momentum[FLAT].clone()
    momentum[chains] = size
    engine.state = engine.state._replace(momentum={FLAT: momentum})


def test_the_gibbs_redraw_comes_after_the_check_at_the_accepted_position():
    engine = _engine(2, gibbs_every=1)
    for _ in range(50):
        engine.step()
    seen = []
    gibbs = engine.gibbs

    class Spy:
        def __getattr__(self, name):
            return getattr(gibbs, name)

        def __call__(self, position, fixed):
            seen.append(position.clone())
            return gibbs(position, fixed)

    engine.gibbs = Spy()
    before = engine.position.clone()
    _kick(engine, [0], 30.0)
    engine.step()
    assert engine.monitor.total == 1
    (position,) = seen
    # chain 0 diverged and was put back: its conditional is drawn at its old position, not at
    # the blown-up one; chain 1 moved on as usual
    torch.testing.assert_close(position[0], before[0])
    torch.testing.assert_close(engine.position[0], before[0])
    assert not torch.equal(position[1], before[1])
    torch.testing.assert_close(position[1], engine.position[1])
    # the value and gradient the next step starts from are those at the redrawn precision
    value, grad = engine.estimator(engine.position, engine.fixed, engine.rows)
    torch.testing.assert_close(engine.value, value)
    torch.testing.assert_close(engine.grad, grad)


def test_restore_anchor_puts_only_the_masked_chains_back_at_rest():
    engine = _engine(2)
    for _ in range(5):
        engine.step()
    engine.keep_anchor()
    anchor_position, anchor_value = engine.position.clone(), engine.value.clone()
    for _ in range(20):
        engine.step()
    moved = engine.position.clone()
    engine.restore_anchor(torch.tensor([True, False]))
    torch.testing.assert_close(engine.position[0], anchor_position[0])
    torch.testing.assert_close(engine.value[0], anchor_value[0])
    assert bool((engine.state.momentum[FLAT][0] == 0).all())
    torch.testing.assert_close(engine.position[1], moved[1])
    assert bool((engine.state.momentum[FLAT][1] != 0).any())


def test_return_to_keeps_psgld_rmsprop_statistics():
    """Putting every chain somewhere else (the descent's average does) keeps pSGLD's RMSprop
    average: a fresh one, rebuilt from one minibatch gradient, made pSGLD with its defaults
    diverge on every seed of the 5,000-row scale family right after the descent."""
    engine = _engine(2, kernel_class=PSGLD)
    for _ in range(5):
        engine.step()
    average = engine.state.square_average[FLAT].clone()
    target = engine.position + 0.01
    engine.return_to(torch.tensor([True, True]), target, engine.fixed)
    torch.testing.assert_close(engine.position, target)
    torch.testing.assert_close(engine.state.square_average[FLAT], average)
    value, grad = engine.estimator(target, engine.fixed, engine.rows)
    torch.testing.assert_close(engine.value, value)
    torch.testing.assert_close(engine.grad, grad)


def test_return_to_rests_the_momenta_of_the_masked_chains_only():
    engine = _engine(2)
    for _ in range(5):
        engine.step()
    before = engine.position.clone()
    target = before + 0.01
    engine.return_to(torch.tensor([True, False]), target, engine.fixed)
    torch.testing.assert_close(engine.position[0], target[0])
    torch.testing.assert_close(engine.position[1], before[1])
    assert bool((engine.state.momentum[FLAT][0] == 0).all())
    assert bool((engine.state.momentum[FLAT][1] != 0).any())


def test_the_anchor_survives_a_checkpoint():
    engine = _engine(1)
    for _ in range(3):
        engine.step()
    engine.keep_anchor()
    anchor = engine.position.clone()
    saved = engine.state_dict()
    for _ in range(10):
        engine.step()
    restored = _engine(1)
    restored.load_state_dict(saved)
    for _ in range(10):
        restored.step()
    torch.testing.assert_close(restored.position, engine.position)
    restored.restore_anchor(torch.tensor([True]))
    torch.testing.assert_close(restored.position, anchor)


class _QuadraticEngine:
    """Just enough of an engine for the power iteration: gradients of a quadratic
    ``0.5 z^T H z``, where ``H`` may change with the size of the probe's shift (a kinked
    gradient: linear for small shifts only)."""

    def __init__(self, hessian, kinked_hessian=None, kink=float("inf")):
        self.hessian, self.kinked, self.kink = hessian, kinked_hessian, kink
        self.calls = 0

    def gradients_around_position(self, shift):
        self.calls += 1
        hessian = self.hessian
        if self.kinked is not None and self.calls > 2:
            hessian = self.kinked  # past the first products, the probe lands past a kink
        return torch.zeros_like(shift), shift @ hessian


def _iterate(engine, dimension):
    deviation = torch.ones(1, dimension, dtype=torch.float64)
    start = torch.ones(1, dimension, dtype=torch.float64)
    return _power_iteration(engine, lambda vector: vector, deviation, start, 8)  # P = I


def test_power_iteration_finds_the_largest_eigenvalue():
    eigenvalues = torch.tensor([10.0, 3.0, 1.0, 0.5], dtype=torch.float64)
    top, vector = _iterate(_QuadraticEngine(torch.diag(eigenvalues)), 4)
    assert abs(float(top) - 10.0) < 0.5
    assert abs(float(vector[0, 0].abs() / vector.norm())) > 0.95


def test_a_collapsed_power_iteration_keeps_its_largest_quotient():
    """Quotients of a power iteration never fall on a fixed matrix; when they fall below
    COLLAPSE times the largest (the probe left the gradient's linear range), the largest is the
    estimate, not the late mean."""
    stiff = torch.diag(torch.tensor([10.0, 3.0, 1.0, 0.5], dtype=torch.float64))
    flat = torch.diag(torch.tensor([1e-4, 1e-4, 1e-4, 0.2], dtype=torch.float64))
    top, _ = _iterate(_QuadraticEngine(stiff, kinked_hessian=flat), 4)
    assert float(top) > COLLAPSE * 10.0
    assert float(top) > 3.0
