"""The divergence monitor's runaway rule, step by step on hand-made moves.

A runaway is a move far larger (in units of the injected noise) than the chain's running level:
the first sign of an unstable step. A chain far from equilibrium whose moves jump once to a
larger but steady size (a momentum building up, a colder likelihood) must not be flagged on
every step from then on: before, SGHMC on the W3 network with a cold likelihood stopped with
"100 divergent steps in a row (last: a runaway move)" at step 102 of a run that is stable.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyro_sgmcmc.engine.divergence import BlowUpDetector, DivergenceMonitor
from pyro_sgmcmc.engine.layout import FlatLayout
from pyro_sgmcmc.errors import SamplerDivergedError

DIMENSION = 50


def _monitor() -> DivergenceMonitor:
    return DivergenceMonitor(1, 100, "sghmc", BlowUpDetector(1, dimension=DIMENSION))


def _check(monitor: DivergenceMonitor, step: int, move_size: float, value: float = 0.0):
    """One step whose largest squared move is ``move_size**2`` injected variances."""
    move = torch.zeros(1, DIMENSION)
    move[0, 0] = move_size
    zeros = torch.zeros(1, DIMENSION)
    return monitor.check(
        torch.tensor([value]), zeros, zeros, step, False, move, torch.ones(1, DIMENSION)
    )


def test_a_steady_larger_move_is_flagged_once_then_accepted():
    monitor = _monitor()
    assert _check(monitor, 1, 2.0) is None  # level 4
    assert _check(monitor, 2, 60.0) is not None  # 3600 > max(25 x 4, 200): a runaway
    # the same move again (the chain was put back): the level took the flagged ratio
    for step in range(3, 20):
        assert _check(monitor, step, 60.0) is None
    assert monitor.total == 1


def test_a_growing_oscillation_is_flagged_again():
    monitor = _monitor()
    assert _check(monitor, 1, 2.0) is None
    flagged = [_check(monitor, step, 2.0 * 6.0**step) is not None for step in range(2, 8)]
    # the move grows sixfold per step (36x in the ratio): each step stays a runaway
    assert all(flagged)


def _checked(monitor: DivergenceMonitor, step: int, value: float, rise: float):
    """A step to potential ``value`` whose rise on the same minibatch is ``rise``."""
    zeros = torch.zeros(1, DIMENSION)
    return monitor.check(
        torch.tensor([value], dtype=torch.float64), zeros, zeros, step, True,
        confirm=lambda: torch.tensor([rise]),
    )  # fmt: skip


def test_a_potential_that_grows_a_little_at_every_step_is_a_blow_up():
    """A ReLU network's first window (load_digits, SGHMC's defaults): the potential grew by
    about 10% a step, from 2,300 to 1e20, each step's rise on its minibatch far below twenty
    typical deviations, which followed it; the chains then froze. Once the running level is
    a hundred times above the lowest potential, the rise confirms itself."""
    monitor = _monitor()
    for step in range(1, 40):  # a healthy stretch: the lowest is about 2,300
        assert _checked(monitor, step, 2300.0 + (step % 3), rise=1.0) is None
    value, flagged = 2300.0, None
    for step in range(40, 300):
        value *= 1.1
        flagged = _checked(monitor, step, value, rise=0.1 * value)
        if flagged is not None:
            break
    assert flagged is not None and value < 1e7, value
    assert monitor.last_reason == "a blow-up of the potential"


def test_a_drifted_chain_is_refused_while_it_climbs_and_may_come_back_down():
    """Once the level stands far above the lowest potential, a step that climbs further is a
    blow-up, but one that descends (the chain put back, then stepping down) is accepted: the
    refusal would otherwise hold every step from the drifted state."""
    monitor = _monitor()
    for step in range(1, 40):
        assert _checked(monitor, step, 2300.0 + (step % 3), rise=1.0) is None
    value, step = 2300.0, 40
    while _checked(monitor, step, value * 1.1, rise=0.1 * value) is None:
        value, step = value * 1.1, step + 1
    assert _checked(monitor, step + 1, value * 1.05, rise=0.05 * value) is not None  # climbs
    # from the last good state a step down, still far above the ceiling, is accepted
    assert _checked(monitor, step + 2, value * 0.95, rise=-0.05 * value) is None


def test_one_minibatch_of_badly_fitted_rows_is_not_a_blow_up():
    """A single minibatch far above the level whose rise on the same rows is small (heavy-tailed
    data) is accepted, and the level it lifts stays below the ceiling over the lowest."""
    monitor = _monitor()
    for step in range(1, 40):
        assert _checked(monitor, step, 2300.0 + (step % 3), rise=1.0) is None
    assert _checked(monitor, 40, 2.0e6, rise=5.0) is None
    for step in range(41, 60):
        assert _checked(monitor, step, 2300.0 + (step % 3), rise=1.0) is None


def test_the_advice_of_a_stuck_chain_fits_how_its_step_was_chosen():
    """A hand-given step: give a smaller one or let the warm-up choose. A step the adaptive
    warm-up chose: not "leave it unset" (it was), but the data's scales, a longer warm-up."""
    layout = FlatLayout({"w": torch.Size([DIMENSION])})
    for adaptive, said, unsaid in [
        (False, "leave both unset for the adaptive warm-up", "The adaptive warm-up chooses"),
        (True, "Standardise the features and the target", "leave both unset"),
    ]:
        monitor = DivergenceMonitor(2, 3, "sghmc", chain_ids=[0, 1], adaptive=adaptive)
        monitor._bad_values = (torch.zeros(1, DIMENSION), torch.zeros(1, DIMENSION))
        monitor._set_consecutive(np.array([0, 3]))
        with pytest.raises(SamplerDivergedError, match=r"chain\(s\) \[1\] had 3 divergent") as e:
            monitor.raise_if_stuck(layout)
        assert said in str(e.value) and unsaid not in str(e.value)
