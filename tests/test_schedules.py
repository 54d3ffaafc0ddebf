"""Step-size schedules: values, phases, validation and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyro_sgmcmc.inference import schedules


def test_constant():
    assert schedules.Constant(0.1)(0) == schedules.Constant(0.1)(10**6) == 0.1


def test_polynomial_decay_values():
    s = schedules.PolynomialDecay(a=0.5, b=10.0, gamma=0.55)
    assert s(0) == pytest.approx(0.5 * 10.0**-0.55)
    assert s(90) == pytest.approx(0.5 * 100.0**-0.55)


def test_cyclical_cosine_values_and_phases():
    s = schedules.CyclicalCosine(initial=1.0, cycle_length=4, exploration_fraction=0.5)
    assert [round(s(t), 6) for t in range(5)] == [
        1.0,
        round(0.5 * (math.cos(math.pi / 4) + 1), 6),
        0.5,
        round(0.5 * (math.cos(3 * math.pi / 4) + 1), 6),
        1.0,
    ]
    assert [s.is_sampling(t) for t in range(8)] == [False, False, True, True] * 2


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: schedules.Constant(0.0), r"value must be > 0"),
        (lambda: schedules.PolynomialDecay(a=-1.0), r"a must be > 0"),
        (lambda: schedules.PolynomialDecay(a=1.0, b=0.0), r"b must be > 0"),
        (lambda: schedules.PolynomialDecay(a=1.0, gamma=1.5), r"gamma must lie in \[0.0, 1.0\]"),
        (lambda: schedules.CyclicalCosine(0.0, 10), r"initial must be > 0"),
        (lambda: schedules.CyclicalCosine(1.0, 0), r"cycle_length must be an integer >= 1"),
        (
            lambda: schedules.CyclicalCosine(1.0, 10, exploration_fraction=1.0),
            r"exploration_fraction must lie in \[0.0, 1.0\)",
        ),
        (lambda: schedules.as_schedule(-2.0, "step_size"), r"step_size must be > 0"),
        (lambda: schedules.PiecewiseConstant((1.0, 0.0), (5,)), r"values\[1\] must be > 0"),
        (lambda: schedules.PiecewiseConstant((1.0, 0.5), (0,)), r"boundaries\[0\] must be"),
        (lambda: schedules.PiecewiseConstant((1.0,), (5,)), r"one more value than boundaries"),
        (
            lambda: schedules.PiecewiseConstant((1.0, 0.5, 0.1), (5, 5)),
            r"boundaries must be strictly increasing",
        ),
        (lambda: schedules.as_schedule(lambda t: -1.0, "lr"), r"must stay > 0"),
    ],
)
def test_invalid_schedules_are_refused(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_as_schedule_rejects_non_numbers():
    with pytest.raises(TypeError, match="step_size"):
        schedules.as_schedule("big", "step_size")


def test_piecewise_constant_switches_at_the_boundaries_and_resumes_from_t():
    s = schedules.PiecewiseConstant(values=[1e-3, 3e-4, 1e-4], boundaries=[2, 4])
    assert [s(t) for t in range(6)] == [1e-3, 1e-3, 3e-4, 3e-4, 1e-4, 1e-4]
    assert all(s.is_sampling(t) for t in range(6))
    assert s == schedules.PiecewiseConstant((1e-3, 3e-4, 1e-4), (2, 4))  # lists become tuples
    with pytest.raises(ValueError, match="t must be >= 0"):
        s(-1)


@settings(max_examples=100, deadline=None)
@given(
    a=st.floats(1e-8, 1e3),
    b=st.floats(1e-3, 1e3),
    gamma=st.floats(0.0, 1.0),
    t=st.integers(0, 10**9),
)
def test_polynomial_decay_is_positive_finite_and_non_increasing(a, b, gamma, t):
    s = schedules.PolynomialDecay(a=a, b=b, gamma=gamma)
    assert 0 < s(t + 1) <= s(t) < math.inf


@settings(max_examples=100, deadline=None)
@given(
    initial=st.floats(1e-8, 1e3),
    length=st.integers(1, 10_000),
    fraction=st.floats(0.0, 0.99),
    t=st.integers(0, 10**9),
)
def test_cyclical_cosine_is_positive_bounded_and_periodic(initial, length, fraction, t):
    s = schedules.CyclicalCosine(initial, length, fraction)
    assert 0 < s(t) <= initial
    assert s(t) == s(t + length)
    assert s.is_sampling(t) == s.is_sampling(t + length)
