"""The divergence monitor's runaway rule, step by step on hand-made moves.

A runaway is a move far larger (in units of the injected noise) than the chain's running level:
the first sign of an unstable step. A chain far from equilibrium whose moves jump once to a
larger but steady size (a momentum building up, a colder likelihood) must not be flagged on
every step from then on: before, SGHMC on the W3 network with a cold likelihood stopped with
"100 divergent steps in a row (last: a runaway move)" at step 102 of a run that is stable.
"""

from __future__ import annotations

import torch

from pyro_sgmcmc.engine.divergence import BlowUpDetector, DivergenceMonitor

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
