"""The defaults on the data's device: adaptive warm-up, the end-of-run verdict, the sick-chain
checks, checkpoints and the export, for a ``BayesianMLP`` and for a hand-written Pyro model
whose data live on a GPU. Each test runs on the CPU in every test run and on CUDA where there is
one (``pytest -m cuda``); docs/distributed.md, "GPUs"."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from device_params import DEVICES
from pyro.infer import MCMC

from pyro_sgmcmc import (
    PSGLD,
    SGHMC,
    SGLD,
    BayesianMLP,
    ResumableMCMC,
    run_chains,
    to_inference_data,
)
from pyro_sgmcmc.nn import GammaPrecision, NormalLikelihood
from pyro_sgmcmc.nn.lenet import LeNet5

pytestmark = pytest.mark.filterwarnings("ignore::pyro_sgmcmc.errors.SamplerWarning")


def regression_data(device: str, num_data: int = 300):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, 3, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 1.0 + 0.5 * torch.randn(num_data, generator=generator)
    return x.to(device), y.to(device)


def linear_model(x, y):
    """Pyro's tutorial regression, written with priors on the data's device."""
    zero = x.new_zeros(())
    w = pyro.sample("w", dist.Normal(zero, 10.0).expand([3]).to_event(1))
    b = pyro.sample("b", dist.Normal(zero, 10.0))
    sigma = pyro.sample("sigma", dist.Uniform(zero, 10.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w + b, sigma), obs=y)


@pytest.mark.parametrize("device", DEVICES)
def test_the_adaptive_warmup_samples_the_posterior_on_the_data_device(device):
    """No step size: the warm-up chooses steps and thinning on the device; the draws stay
    there and their means sit near least squares (300 rows: posterior sds about 0.03)."""
    x, y = regression_data(device)
    mcmc = MCMC(SGHMC(linear_model, batch_size=50, seed=0), num_samples=60, warmup_steps=60,
                disable_progbar=True)  # fmt: skip
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert all(value.device.type == device for value in samples.values())
    design = torch.cat([x, torch.ones_like(x[:, :1])], dim=1).cpu().double()
    solution = torch.linalg.lstsq(design, y.cpu().double().unsqueeze(-1)).solution.squeeze(-1)
    drawn = torch.cat([samples["w"].mean(0), samples["b"].mean(0, keepdim=True)]).cpu().double()
    assert (drawn - solution).abs().max() < 0.2


@pytest.mark.parametrize("device", DEVICES)
def test_run_chains_defaults_checkpoint_and_resume_bit_for_bit_on_the_device(device, tmp_path):
    """An interrupted run resumed from its checkpoint equals the uninterrupted run exactly,
    adaptive warm-up included, on the device's own generators."""
    model = BayesianMLP(3, [8], 1).to(device)
    x, y = regression_data(device, 200)
    options = {"num_chains": 2, "num_samples": 6, "warmup_steps": 40}

    def kernel():
        return SGLD(model, batch_size=25, num_steps_per_sample=2, seed=3)

    whole = run_chains(kernel(), x, y, **options)
    path = tmp_path / "run.ckpt"

    def stop(index, draw):
        if index == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_chains(kernel(), x, y, callback=stop, checkpoint_path=path, checkpoint_every=1,
                   **options)  # fmt: skip
    resumed = run_chains(kernel(), x, y, resume_from=path, **options)
    for name, value in whole.samples.items():
        assert value.device.type == device
        assert torch.equal(resumed.samples[name], value), name
    idata = to_inference_data(whole, model, x, y, test=(x[:20], y[:20]))
    assert idata.log_likelihood["obs"].shape == (2, 6, 200)


@pytest.mark.parametrize("device", DEVICES)
def test_resumable_mcmc_interrupted_in_warmup_resumes_bit_for_bit_on_the_device(device, tmp_path):
    """Interrupted in the middle of the first chain's adaptive warm-up (its milestones and fit
    averages half built), resumed: the same draws as a run that was never interrupted."""
    x, y = regression_data(device, 200)

    def kernel():
        return SGHMC(linear_model, batch_size=40, num_steps_per_sample=2, seed=1)

    def run(path, hook=None):
        mcmc = ResumableMCMC(kernel(), 5, warmup_steps=30, num_chains=2, disable_progbar=True,
                             checkpoint_path=path, checkpoint_every=1, hook_fn=hook)  # fmt: skip
        mcmc.run(x, y)
        return mcmc

    whole = run(tmp_path / "whole.ckpt")
    calls = []

    def stop(kernel, params, stage, index):
        calls.append(index)
        if len(calls) == 20:
            raise KeyboardInterrupt

    path = tmp_path / "interrupted.ckpt"
    with pytest.raises(KeyboardInterrupt):
        run(path, stop)
    again = ResumableMCMC.resume(path, kernel(), x, y, disable_progbar=True)
    for name, value in whole.get_samples().items():
        assert value.device.type == device
        assert torch.equal(again.get_samples()[name], value), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", [SGLD, SGHMC, PSGLD], ids=["sgld", "sghmc", "psgld"])
def test_a_network_with_gibbs_precisions_samples_on_the_device(device, kernel):
    """Gamma hyper-priors on the weights and the noise (exact Gibbs steps), adaptive warm-up,
    every kernel: all of it stays on the data's device."""
    model = BayesianMLP(
        3, [8], 1, prior=GammaPrecision(2.0, 1.0),
        likelihood=NormalLikelihood(precision=GammaPrecision(2.0, 0.5)),
    ).to(device)  # fmt: skip
    x, y = regression_data(device, 200)
    result = run_chains(kernel(model, batch_size=25, num_steps_per_sample=2, seed=0), x, y,
                        num_chains=2, num_samples=5, warmup_steps=30)  # fmt: skip
    for name, value in result.samples.items():
        assert value.device.type == device and bool(torch.isfinite(value).all()), name
    assert "noise_precision" in result.samples


@pytest.mark.parametrize("device", DEVICES)
def test_lenet5_takes_steps_on_the_device(device):
    model = LeNet5().to(device)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(64, 1, 28, 28, generator=generator).to(device)
    labels = torch.randint(0, 10, (64,), generator=generator).to(device)
    kernel = SGHMC(model, step_size=1e-4, batch_size=16, num_steps_per_sample=2, seed=0)
    result = run_chains(kernel, images, labels, num_chains=1, num_samples=3)
    assert result.samples["fc3.weight"].device.type == device
    assert bool(torch.isfinite(result.samples["conv1.weight"]).all())
