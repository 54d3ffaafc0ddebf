"""The vectorised rank-normalised R-hat and bulk and tail ESS against ArviZ, quantity by quantity.

The draws cover what a verdict meets: slow random walks, independent draws, antithetic chains,
ties (rounded values), indicators, a constant, chains constant but apart, shifted chains, an odd
number of draws, one chain, four draws, and a non-finite value.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from pyro_sgmcmc.analysis import _arviz
from pyro_sgmcmc.analysis.diagnostics import worst_statistics
from pyro_sgmcmc.analysis.rank_diagnostics import (
    ess_bulk,
    ess_of_draws,
    ess_tail,
    map_quantities,
    rank_rhat,
    split_chains,
    worst_of_all,
)

az = pytest.importorskip("arviz")


def _draws(chains: int, draws: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(chains, draws, 32))
    x[..., :8] = x[..., :8].cumsum(1) * 0.3
    x[..., 8:12] = np.round(x[..., 8:12])
    x[..., 12] = 1.0
    x[..., 13] = np.arange(chains)[:, None]
    x[..., 14:17] += np.arange(chains)[:, None, None] * 0.5
    x[..., 17:21] = (x[..., 17:21] > 0.8).astype(float)
    noise = rng.normal(size=(chains, draws, 5))
    antithetic = np.zeros_like(noise)
    for s in range(1, draws):
        antithetic[:, s] = -0.7 * antithetic[:, s - 1] + noise[:, s]
    x[..., 21:26] = antithetic
    return x


def _arviz_statistic(x: np.ndarray, name: str) -> np.ndarray:
    dataset = xr.Dataset({"v": (("chain", "draw", "k"), x)})
    if name == "rhat":
        return az.rhat(dataset)["v"].values
    if name == "tail" and _arviz.ARVIZ_1:
        return az.ess(dataset, method="tail", prob=_arviz.TAIL_PROB)["v"].values
    return az.ess(dataset, method=name)["v"].values


def _agree(ours: np.ndarray, theirs: np.ndarray) -> None:
    finite = np.isfinite(theirs) & (np.abs(theirs) < 1e12)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-9)
    # ArviZ's R-hat of chains constant but apart is inf or a huge number, by rounding
    assert (~np.isfinite(ours[~finite]) | (np.abs(ours[~finite]) > 1e12)).all()


@pytest.mark.parametrize(("chains", "draws"), [(2, 200), (4, 101), (3, 7), (2, 4), (1, 60)])
def test_the_statistics_are_arvizs(chains, draws):
    x = _draws(chains, draws)
    statistics = {"bulk": ess_bulk, "tail": ess_tail}
    if chains > 1:
        statistics["rhat"] = rank_rhat
    for name, statistic in statistics.items():
        _agree(statistic(x), _arviz_statistic(x, name))


@pytest.mark.parametrize(("chains", "draws"), [(2, 200), (4, 101), (3, 7), (1, 60)])
def test_the_plain_ess_of_the_split_draws_is_arvizs_mean_ess(chains, draws):
    """:func:`ess_of_draws` takes the draws as they are (the warm-up's thinning measures one
    chain's series with it); of the split draws it is ArviZ's ESS of the mean."""
    x = _draws(chains, draws)
    split = split_chains(np.ascontiguousarray(np.moveaxis(x, 2, 0)))  # (K, 2C, S // 2)
    _agree(ess_of_draws(np.moveaxis(split, 0, 2)), _arviz_statistic(x, "mean"))


def test_a_non_finite_draw_gives_nan_for_its_quantity_only():
    x = _draws(2, 50)
    x[1, 7, 3] = np.nan
    for name, statistic in {"rhat": rank_rhat, "bulk": ess_bulk, "tail": ess_tail}.items():
        ours = statistic(x)
        assert np.isnan(ours[3]) and np.isfinite(ours[:3]).all()
        _agree(np.delete(ours, 3), np.delete(_arviz_statistic(x, name), 3))


def test_datasets_and_the_worst_of_all_quantities():
    x = _draws(2, 120)[..., 14:]  # no constant quantity: finite R-hat everywhere
    dataset = xr.Dataset(
        {"a": (("chain", "draw", "i", "j"), x[..., :6].reshape(2, 120, 2, 3)),
         "b": (("chain", "draw"), x[..., 6])}
    )  # fmt: skip
    rhat = map_quantities(dataset, rank_rhat)
    assert rhat["a"].dims == ("i", "j") and rhat["b"].dims == ()
    np.testing.assert_allclose(rhat["a"].values.ravel(), rank_rhat(x[..., :6]))
    flat = np.concatenate([x[..., :6], x[..., 6:7]], axis=2)
    assert worst_statistics(dataset) == worst_of_all(flat)
    max_rhat, bulk, tail, classic = worst_of_all(flat)
    assert max_rhat == pytest.approx(rank_rhat(flat).max())
    assert bulk == pytest.approx(ess_bulk(flat).min()) and tail == pytest.approx(
        ess_tail(flat).min()
    )
    assert classic == pytest.approx(_classic_split_rhat(flat).max(), rel=1e-12)
    # one chain: no R-hat; a quantity constant within chains but not across: R-hat inf
    assert math.isnan(worst_of_all(flat[:1])[0])
    assert worst_of_all(_draws(2, 50)[..., 13:14])[0] == math.inf
    # a quantity constant in every draw (a probability saturated at 1) has no R-hat: left out
    saturated = np.concatenate([flat, np.ones((2, 120, 1))], axis=2)
    assert worst_of_all(saturated) == worst_of_all(flat)
    assert math.isnan(worst_of_all(np.ones((2, 120, 3)))[0])


def _classic_split_rhat(draws: np.ndarray) -> np.ndarray:
    """Gelman et al.'s split R-hat of ``(C, S, K)`` draws, written out (BDA3, eq. 11.4)."""
    half = draws.shape[1] // 2
    first, second = draws[:, :half], draws[:, draws.shape[1] - half :]
    split = np.concatenate([first, second])  # (2C, n, K)
    n = split.shape[1]
    between = n * split.mean(1).var(0, ddof=1)
    within = split.var(1, ddof=1).mean(0)
    return np.sqrt(((n - 1) / n * within + between / n) / within)


def test_chains_that_barely_move_are_told_by_the_classic_r_hat_not_the_rank_one():
    """Four chains that each move a hundred-thousandth of the distance between them: ranks
    cap the rank-normalised R-hat near 3, as for chains that are merely slow; the classic
    split R-hat of the draws sees how little they move."""
    rng = np.random.default_rng(3)
    centres = np.array([-1.5, -0.5, 0.5, 1.5])[:, None, None]
    barely = centres + 1e-5 * rng.standard_normal((4, 200, 3))
    slow = centres + 0.5 * rng.standard_normal((4, 200, 3))
    max_rhat, _, _, classic = worst_of_all(barely)
    slow_rhat, _, _, slow_classic = worst_of_all(slow)
    assert 2 < max_rhat < 6 and max_rhat == pytest.approx(_arviz_statistic(barely, "rhat").max())
    assert classic > 5e4 and classic == pytest.approx(_classic_split_rhat(barely).max())
    assert slow_rhat > 1.5 and slow_classic < 10
