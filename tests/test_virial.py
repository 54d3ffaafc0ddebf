"""The configurational temperature meter: its running batch statistics equal those of the
stored terms, it flags chains too hot and too cold, its state does not grow with the run, and a
checkpoint (also one of the earlier format, which kept the terms) resumes it exactly."""

from __future__ import annotations

import math

import torch

from pyro_sgmcmc.engine.virial import FAR_TOO_HOT, VirialMeter


def _terms(meter: VirialMeter, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Feed ``steps`` random updates to ``meter``; the ``(C,)`` terms it measured."""
    generator = torch.Generator().manual_seed(seed)
    terms = []
    for _ in range(steps):
        position = torch.randn(meter.num_chains, 6, generator=generator, dtype=torch.float64)
        grad = torch.randn(meter.num_chains, 6, generator=generator, dtype=torch.float64)
        if meter.calls % meter.stride == meter.stride - 1:
            reference = position if meter.reference is None else meter.reference
            terms.append(((position - reference) * grad).sum(1) / 6)
        meter.update(position, grad)
    return terms


def test_the_running_statistics_are_those_of_the_batch_means():
    meter = VirialMeter(3, stride=4, batch=10)
    terms = _terms(meter, 4 * 10 * 7 + 9)  # 7 full batches and part of the next
    assert meter.batches == 7
    means = torch.stack(terms[:70]).reshape(7, 10, 3).mean(1)
    value, error = meter.estimate()
    torch.testing.assert_close(value, means.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(error, means.std(0) / math.sqrt(7), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(meter.lowest, means.min(0).values, rtol=0.0, atol=1e-12)
    assert VirialMeter(3).estimate() is None  # fewer than two batches


def test_chains_too_hot_and_too_cold_are_flagged():
    meter = VirialMeter(4, stride=1, batch=10)
    generator = torch.Generator().manual_seed(1)
    levels = torch.tensor([1.0, 3.0, 0.5, 1.0], dtype=torch.float64)
    for _ in range(400):
        meter._add(levels + 0.05 * torch.randn(4, generator=generator, dtype=torch.float64))
    assert meter.too_hot(1.0).tolist() == [False, True, False, False]
    assert meter.too_cold(1.0).tolist() == [False, False, True, False]
    # batch means that differ by orders of magnitude, all far above T: too hot however noisy
    noisy = VirialMeter(1, stride=1, batch=1)
    for value in (20.0, 2e3, 40.0, 9e4):
        noisy._add(torch.tensor([value], dtype=torch.float64))
    value, error = noisy.estimate()
    assert float(value - 1.5) < 4.0 * float(error)  # the standard error alone would not tell
    assert noisy.too_hot(1.0).tolist() == [20.0 > FAR_TOO_HOT * 1.5]


def test_the_state_does_not_grow_with_the_run():
    def size(meter):
        state = meter.state_dict()
        return sum(v.numel() if torch.is_tensor(v) else 1 for v in state.values() if v is not None)

    meter = VirialMeter(2)
    _terms(meter, 100)
    early = size(meter)
    _terms(meter, 10_000)
    assert size(meter) == early


def test_a_checkpoint_resumes_the_meter_exactly():
    whole = VirialMeter(2)
    _terms(whole, 250, seed=3)
    state = whole.state_dict()
    resumed = VirialMeter(2)
    resumed.load_state_dict(state)
    _terms(whole, 300, seed=4)
    _terms(resumed, 300, seed=4)
    for a, b in zip(whole.estimate(), resumed.estimate(), strict=True):
        assert torch.equal(a, b)
    # the state is a copy: the meter's own updates do not change it
    assert state["batches"] < whole.batches and state["mean"] is not whole.mean


def test_a_checkpoint_that_kept_the_terms_loads_as_their_statistics():
    generator = torch.Generator().manual_seed(5)
    terms = [torch.randn(2, generator=generator, dtype=torch.float64) for _ in range(57)]
    fed = VirialMeter(2, stride=1)
    for term in terms:
        fed._add(term)
    old = VirialMeter(2, stride=1)
    old.load_state_dict({"reference": torch.zeros(2, 6), "values": terms, "calls": 57})
    assert old.batches == fed.batches == 5 and old.batch_terms == 7
    for a, b in zip(fed.estimate(), old.estimate(), strict=True):
        assert torch.equal(a, b)
