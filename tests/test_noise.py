"""The injected noise: drawn in blocks per chain, independent of the other chains, resumable."""

from __future__ import annotations

import torch

from pyro_sgmcmc.engine.noise import GaussianNoise


def _generators(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_a_chain_draws_the_same_noise_alone_or_beside_others():
    dimension = 300
    like_one, like_three = torch.zeros(1, dimension), torch.zeros(3, dimension)
    alone = GaussianNoise(_generators([7]))
    together = GaussianNoise(_generators([5, 7, 9]))
    steps = 2 * GaussianNoise.steps_per_block(dimension) + 3  # across block boundaries
    for _ in range(steps):
        assert torch.equal(alone(like_one)[0], together(like_three)[1])


def test_the_draws_are_standard_normal_and_not_repeated():
    noise = GaussianNoise(_generators([0]))
    draws = torch.stack([noise(torch.zeros(1, 2000))[0] for _ in range(200)])
    assert abs(float(draws.mean())) < 4 / (draws.numel() ** 0.5)
    assert abs(float(draws.var()) - 1.0) < 4 * (2 / draws.numel()) ** 0.5
    assert not torch.equal(draws[32], draws[33])  # block boundary: a fresh block


def test_resuming_mid_block_continues_the_same_noise():
    like = torch.zeros(2, 500)
    run = GaussianNoise(_generators([1, 2]))
    for _ in range(10):
        run(like)
    generators = _generators([0, 0])
    for saved, generator in zip([g.get_state() for g in run.generators], generators, strict=True):
        generator.set_state(saved)
    resumed = GaussianNoise(generators)
    resumed.load_state_dict(run.state_dict())
    for _ in range(3 * GaussianNoise.steps_per_block(500)):
        assert torch.equal(run(like), resumed(like))


def test_dtype_and_device_follow_the_positions():
    draw = GaussianNoise(_generators([0]))(torch.zeros(1, 4, dtype=torch.float64))
    assert draw.dtype == torch.float64 and draw.shape == (1, 4)
