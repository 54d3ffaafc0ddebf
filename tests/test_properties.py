"""Property-based tests (hypothesis) that complement tests/test_dynamics.py and
tests/test_schedules.py: zero step sizes, constant SGD, momentum refreshment, the gradient-noise
estimate and the minibatch order that checkpoints save."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_sgmcmc.dynamics import (
    optimal_constant_rates,
    partial_momentum_refresh,
    psgld_init,
    psgld_step,
    sgd_init,
    sgd_step,
    sghmc_init,
    sghmc_step,
    update_gradient_noise_estimate,
)
from pyro_sgmcmc.engine.minibatch import Minibatcher

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
vectors = st.lists(finite, min_size=1, max_size=5)
unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
rates = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def tensor(values):
    return torch.tensor(values, dtype=torch.float64)


@settings(max_examples=50, deadline=None)
@given(theta=vectors, temperature=st.floats(0.0, 10.0), decay=st.floats(0.0, 0.999), data=st.data())
def test_psgld_zero_step_size_leaves_position_unchanged(theta, temperature, decay, data):
    grad = data.draw(st.lists(finite, min_size=len(theta), max_size=len(theta)))
    start = {"x": tensor(theta)}
    state = psgld_step(
        psgld_init(start),
        {"x": tensor(grad)},
        0.0,
        temperature,
        torch.Generator().manual_seed(0),
        num_data=10,
        decay=decay,
    )
    assert torch.equal(state.position["x"], start["x"])
    assert (state.square_average["x"] >= 0).all()


@settings(max_examples=50, deadline=None)
@given(theta=finite, velocity=finite, grad=finite, friction=unit, temperature=st.floats(0.0, 5.0))
def test_sghmc_zero_step_size_only_damps_the_momentum(theta, velocity, grad, friction, temperature):
    state = sghmc_init({"x": tensor([theta])}, {"x": tensor([velocity])})
    new = sghmc_step(state, {"x": tensor([grad])}, 0.0, friction, temperature, torch.Generator())
    damped = (1.0 - friction) * tensor([velocity])
    assert torch.equal(new.momentum["x"], damped)
    assert torch.equal(new.position["x"], tensor([theta]) + damped)
    if velocity == 0.0:
        assert torch.equal(new.position["x"], tensor([theta]))


@settings(max_examples=50, deadline=None)
@given(theta=finite, grad=finite, rate=rates)
def test_sgd_step_is_a_finite_gradient_step(theta, grad, rate):
    new = sgd_step(sgd_init({"x": tensor([theta])}), {"x": tensor([grad])}, rate)
    assert torch.isfinite(new.position["x"]).all()
    assert torch.equal(new.position["x"], tensor([theta]) - rate * tensor([grad]))
    diagonal = sgd_step(
        sgd_init({"x": tensor([theta])}), {"x": tensor([grad])}, {"x": tensor([rate])}
    )
    assert torch.equal(diagonal.position["x"], new.position["x"])
    unchanged = sgd_step(sgd_init({"x": tensor([theta])}), {"x": tensor([grad])}, 0.0)
    assert torch.equal(unchanged.position["x"], tensor([theta]))


@settings(max_examples=50, deadline=None)
@given(momentum=vectors, persistence=unit, scale=st.floats(0.0, 1e3))
def test_partial_momentum_refresh_is_finite_and_keeps_momentum_at_persistence_one(
    momentum, persistence, scale
):
    p = {"v": tensor(momentum)}
    refreshed = partial_momentum_refresh(p, persistence, scale, torch.Generator().manual_seed(1))
    assert torch.isfinite(refreshed["v"]).all()
    assert torch.equal(partial_momentum_refresh(p, 1.0, scale, torch.Generator())["v"], p["v"])


@settings(max_examples=20, deadline=None)
@given(persistence=unit, scale=st.floats(0.1, 10.0))
def test_partial_momentum_refresh_keeps_its_gaussian_invariant(persistence, scale):
    generator = torch.Generator().manual_seed(2)
    p = {"v": scale * torch.randn(20000, generator=generator, dtype=torch.float64)}
    refreshed = partial_momentum_refresh(p, persistence, scale, generator)["v"]
    # Var = a^2 s^2 + (1 - a^2) s^2 = s^2; standard error of a variance estimate ~ s^2 sqrt(2/n).
    assert abs(float(refreshed.var()) / scale**2 - 1.0) < 5 * (2 / 20000) ** 0.5


@settings(max_examples=50, deadline=None)
@given(values=st.lists(vectors, min_size=1, max_size=6), decay=st.floats(0.0, 0.999))
def test_gradient_noise_variance_estimate_is_never_negative(values, decay):
    size = len(values[0])
    estimate = None
    for g in values:
        g = (g * size)[:size]
        estimate = update_gradient_noise_estimate(estimate, {"x": tensor(g)}, decay)
        assert (estimate.variance["x"] >= -1e-9 * (1 + estimate.mean["x"].abs().max() ** 2)).all()
    assert estimate.count == len(values)


@settings(max_examples=50, deadline=None)
@given(noise=st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=5), num_data=st.integers(2, 10**6))
def test_optimal_constant_rates_are_positive_and_finite(noise, num_data):
    square = {"x": tensor(noise)}
    scalar = optimal_constant_rates(square, num_data)
    diagonal = optimal_constant_rates(square, num_data, diagonal=True)
    assert 0 < scalar < float("inf")
    assert torch.isfinite(diagonal["x"]).all() and (diagonal["x"] > 0).all()


@settings(max_examples=40, deadline=None)
@given(
    num_data=st.integers(1, 50),
    data=st.data(),
    independent=st.booleans(),
    seed=st.integers(0, 2**31),
    chains=st.integers(1, 3),
)
def test_minibatch_order_resumes_exactly_from_its_state(num_data, data, independent, seed, chains):
    batch_size = data.draw(st.integers(1, num_data))
    # the chains' batches interleaved with the warm-up's measurement batches (``probe``)
    calls = st.lists(st.sampled_from(["next", "probe"]), max_size=12)
    before, after = data.draw(calls), data.draw(calls.filter(len))
    sampling = "independent" if independent else "epoch"
    generators = [torch.Generator().manual_seed(seed + c) for c in range(chains)]
    batches = Minibatcher(num_data, batch_size, generators, sampling)
    for call in before:
        getattr(batches, call)()
    saved, saved_rng = batches.state_dict(), [g.get_state() for g in generators]
    expected = [getattr(batches, call)() for call in after]
    others = [torch.Generator().manual_seed(seed + 100) for _ in range(chains)]
    for generator, state in zip(others, saved_rng, strict=True):
        generator.set_state(state)
    restored = Minibatcher(num_data, batch_size, others, sampling)
    restored.load_state_dict(saved)
    for call, want in zip(after, expected, strict=True):
        got = getattr(restored, call)()
        assert (want is None and got is None) or torch.equal(want, got)
        if got is not None:
            assert got.shape == (chains, batch_size)
            for row in got:
                assert len(set(row.tolist())) == batch_size
            assert 0 <= int(got.min()) and int(got.max()) < num_data


@settings(max_examples=30, deadline=None)
@given(num_data=st.integers(2, 40), data=st.data(), seed=st.integers(0, 2**31))
def test_a_chain_draws_the_same_minibatches_alone_or_among_others(num_data, data, seed):
    batch_size = data.draw(st.integers(1, num_data - 1))
    seeds = [seed, seed + 1, seed + 2]
    stacked = Minibatcher(num_data, batch_size, [torch.Generator().manual_seed(s) for s in seeds])
    alone = Minibatcher(num_data, batch_size, [torch.Generator().manual_seed(seeds[1])])
    for _ in range(5):
        assert torch.equal(stacked.next()[1], alone.next()[0])


def test_probe_batches_are_uniform_distinct_rows_apart_from_the_chains_batches():
    """Each measurement batch holds distinct rows; a walk's batches are disjoint; every row is
    drawn as often as the others within binomial error; and a probe batch shares rows with the
    chains' batch beside it as two independent batches do (hypergeometric mean B^2 / N)."""
    num_data, batch_size, draws = 50, 7, 3000
    batches = Minibatcher(num_data, batch_size, [torch.Generator().manual_seed(3)])
    counts = torch.zeros(num_data)
    overlaps = []
    walk: set[int] = set()
    for _ in range(draws):
        rows = batches.probe()[0].tolist()
        assert len(set(rows)) == batch_size
        if batches._probe_position == batch_size:  # a new permutation began
            walk = set()
        assert walk.isdisjoint(rows)
        walk.update(rows)
        counts[rows] += 1
        overlaps.append(len(set(rows) & set(batches.next()[0].tolist())))
    expected = draws * batch_size / num_data
    # binomial sd of a row's count is below sqrt(expected); 5 sd over 50 rows
    assert float((counts - expected).abs().max()) < 5 * expected**0.5
    # hypergeometric: mean B^2/N = 0.98, variance below 0.8; 5 standard errors
    mean_overlap = sum(overlaps) / draws
    assert abs(mean_overlap - batch_size**2 / num_data) < 5 * (0.8 / draws) ** 0.5
