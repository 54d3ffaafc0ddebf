# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 1. Linear regression with three samplers
#
# A model small enough that the posterior is known in closed form, sampled three ways:
#
# * **random-walk Metropolis** (Pyro's `RandomWalkKernel`): proposals
#   $\theta^* = \theta + \mathcal N(0, s^2 I)$ accepted with probability
#   $\min\{1, \pi(\theta^*)/\pi(\theta)\}$, no gradients;
# * **SGLD** (`pyro_sgmcmc.SGLD`, Welling & Teh 2011, with Leimkuhler & Matthews' integrator):
#   Langevin steps on a minibatch gradient of 10 of the 30 points, no accept/reject step;
# * **NUTS** (Pyro's `NUTS`): Hamiltonian trajectories on the full-data gradient with a
#   Metropolis correction.
#
# All three see the same Pyro model. We start every chain far from the posterior, look at the
# traces to see the burn-in, and then compare the kept draws with the exact conjugate posterior.
#
# **Run modes.** By default this notebook runs its full configuration (about a minute on one CPU
# core; the outputs shown are from such a run). With the environment variable
# `PYRO_SGMCMC_SMOKE=1` (what CI uses to check that the notebook runs) every chain is shortened
# so that the notebook runs in well under a minute; the numbers in the final table are then
# noisier.

# %%
import logging
import warnings

# Keep the outputs to results: tqdm warns that ipywidgets is missing, Pyro that a machine with
# few cores runs the chains one after the other, ArviZ (below) that one chain has no R-hat.
warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="num_chains=.*sequentially")

import math
import os
import time

import arviz as az
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pyro
import pyro.distributions as dist
import torch
from IPython.display import display
from pyro.infer import MCMC, NUTS, RandomWalkKernel

from pyro_sgmcmc import SGLD, from_draws, sequential_chains
from pyro_sgmcmc.analysis.diagnostics import convergence_report

logging.getLogger("arviz").setLevel(logging.ERROR)  # ArviZ sets its level on import

pd.options.display.float_format = "{:.3f}".format
NOTEBOOK_START = time.perf_counter()
SMOKE = os.environ.get("PYRO_SGMCMC_SMOKE", "0") == "1"
pyro.set_rng_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## Data
#
# Thirty points from $y_n = \beta_0 + \beta_1 x_n + \varepsilon_n$ with $\beta_0 = -1$,
# $\beta_1 = 2$, $\varepsilon_n \sim \mathcal N(0, 0.5^2)$ and $x_n \sim \mathcal U(-1, 1)$.

# %%
N = 30
TRUE_INTERCEPT, TRUE_SLOPE, TRUE_SIGMA = -1.0, 2.0, 0.5
x = dist.Uniform(-1.0, 1.0).sample((N,))
y = TRUE_INTERCEPT + TRUE_SLOPE * x + TRUE_SIGMA * torch.randn(N)

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.scatter(x, y, s=15, color="k")
ax.set(xlabel="x", ylabel="y", title="30 noisy points on a line")
fig.tight_layout()

# %% [markdown]
# ## Model and exact posterior
#
# A normal-inverse-gamma prior is conjugate to this likelihood, so the posterior is known exactly:
#
# $$
# \sigma^2 \sim \mathrm{InvGamma}(a_0, b_0), \qquad
# \beta \mid \sigma^2 \sim \mathcal N(0, \sigma^2 v_0 I), \qquad
# y_n \mid \beta, \sigma^2 \sim \mathcal N(\beta_0 + \beta_1 x_n, \sigma^2).
# $$
#
# With the design matrix $X = [1, x]$, the posterior is
# $\sigma^2 \mid y \sim \mathrm{InvGamma}(a_N, b_N)$ and
# $\beta \mid \sigma^2, y \sim \mathcal N(m_N, \sigma^2 V_N)$, where
# $V_N = (I / v_0 + X^\top X)^{-1}$, $m_N = V_N X^\top y$, $a_N = a_0 + N/2$ and
# $b_N = b_0 + \tfrac12 (y^\top y - m_N^\top V_N^{-1} m_N)$. Marginally each $\beta_j$ is a
# Student-$t$ with $2a_N$ degrees of freedom and variance $V_{N,jj}\, b_N / (a_N - 1)$.
#
# The model follows the data-plate contract of `pyro_sgmcmc`: global latent sites are drawn
# outside `pyro.plate("data", N)`, and the observations inside it are indexed by the plate's
# indices, so an SG-MCMC kernel can restrict the plate to a minibatch while NUTS and
# random-walk Metropolis run the same function on all 30 points.

# %%
A0, B0, V0 = 2.0, 0.5, 100.0


def model(x, y):
    noise_var = pyro.sample("noise_var", dist.InverseGamma(A0, B0))
    coef = pyro.sample("coef", dist.Normal(0.0, (noise_var * V0).sqrt()).expand([2]).to_event(1))
    mean = coef[0] + coef[1] * x
    with pyro.plate("data", x.shape[0]) as idx:
        pyro.sample("y", dist.Normal(mean[idx], noise_var.sqrt()), obs=y[idx])


def exact_posterior(x, y):
    design = torch.stack([torch.ones_like(x), x], dim=1).double()
    yy = y.double()
    precision = torch.eye(2, dtype=torch.float64) / V0 + design.T @ design
    cov = torch.linalg.inv(precision)
    mean = cov @ design.T @ yy
    a_n = A0 + 0.5 * len(yy)
    b_n = B0 + 0.5 * (yy @ yy - mean @ precision @ mean)
    coef_sd = (torch.diagonal(cov) * b_n / (a_n - 1)).sqrt()
    # sigma = sqrt(noise_var) with noise_var ~ InvGamma(a_n, b_n):
    # E[sigma] = sqrt(b_n) Gamma(a_n - 1/2) / Gamma(a_n), E[sigma^2] = b_n / (a_n - 1).
    sigma_mean = math.sqrt(b_n) * math.exp(math.lgamma(a_n - 0.5) - math.lgamma(a_n))
    sigma_sd = math.sqrt(float(b_n) / (a_n - 1) - sigma_mean**2)
    return {
        "intercept": (float(mean[0]), float(coef_sd[0])),
        "slope": (float(mean[1]), float(coef_sd[1])),
        "sigma": (sigma_mean, sigma_sd),
    }


exact = exact_posterior(x, y)
pd.DataFrame(exact, index=["mean", "sd"]).round(4)

# %% [markdown]
# ## Running the three samplers
#
# Each sampler runs two chains from the same poor starting point
# ($\beta = (4, -4)$, $\sigma^2 = 4$), given in unconstrained space (Pyro samples
# $\log \sigma^2$). A `hook_fn` records every draw, warm-up included, so that we can see the
# burn-in; `pyro.infer.MCMC` itself keeps only the post-warm-up draws.
#
# Settings:
#
# * Random-walk Metropolis adapts its proposal scale during warm-up towards an acceptance rate
#   of 0.234.
# * SGLD is given nothing but its batch size: like NUTS, it adapts everything else during
#   warm-up. Its warm-up draws (200 draws of 20 gradient steps each, on minibatches of 10 points:
#   a kernel that chooses its thinning warms up for at least 4000 gradient steps) first descend
#   towards the posterior without injected noise, then measure the curvature and the
#   minibatch-gradient noise and set a step size and, this model having only three coordinates,
#   a dense preconditioner (the intercept and slope are correlated), decide whether a
#   control-variate gradient would let the steps grow, and finally measure each chain's
#   autocorrelation time, which becomes its thinning: one kept draw per autocorrelation time, so
#   that a kept draw is worth about one effective draw. All of it is frozen for the kept draws
#   (see the "Adaptive warm-up" page of the documentation). The step is chosen so that the
#   discretisation bias stays at a few per cent of the variance; a hand-picked
#   `step_size=` (which multiplies the gradient of the *full-data* potential) switches the
#   adaptation off.
# * NUTS adapts its step size and a diagonal mass matrix during warm-up.

# %%
NUM_CHAINS = 2
if SMOKE:
    SETTINGS = {
        "RWM": {"warmup": 300, "samples": 400},
        "SGLD": {"warmup": 60, "samples": 100},
        "NUTS": {"warmup": 80, "samples": 120},
    }
else:
    SETTINGS = {
        "RWM": {"warmup": 2000, "samples": 5000},
        "SGLD": {"warmup": 200, "samples": 1000},
        "NUTS": {"warmup": 500, "samples": 1000},
    }

START = {"coef": torch.tensor([4.0, -4.0]), "noise_var": torch.tensor(math.log(4.0))}


def make_kernel(name):
    if name == "RWM":
        return RandomWalkKernel(model, init_step_size=0.1)
    if name == "SGLD":
        return SGLD(model, batch_size=10, seed=1)
    return NUTS(model)


def run_sampler(name):
    """Run ``NUM_CHAINS`` chains; return kept draws, every draw (with warm-up), and seconds."""
    setting = SETTINGS[name]
    every_draw = []

    def hook(kernel, params, stage, i):
        # Pyro names the stages "Warmup [chain]" and "Sample [chain]"; warm-up comes first.
        if stage.startswith("Warmup") and i == 0:
            every_draw.append([])
        every_draw[-1].append(
            {"intercept": float(params["coef"][0]), "slope": float(params["coef"][1])}
        )

    # the hook collects in this process: keep the chains here on any machine (with a spare
    # core per chain Pyro would run each in a worker process, where the hook runs too)
    with sequential_chains():
        mcmc = MCMC(
            make_kernel(name),
            num_samples=setting["samples"],
            warmup_steps=setting["warmup"],
            num_chains=NUM_CHAINS,
            initial_params={k: v.expand(NUM_CHAINS, *v.shape) for k, v in START.items()},
            hook_fn=hook,
            mp_context=None,
            disable_progbar=True,
        )
    start = time.perf_counter()
    mcmc.run(x, y)
    seconds = time.perf_counter() - start
    draws = mcmc.get_samples(group_by_chain=True)
    if name == "SGLD":
        THINNING.extend(mcmc.diagnostics()["num_steps_per_sample"].values())
    return draws, every_draw, seconds


THINNING = []


results = {name: run_sampler(name) for name in SETTINGS}
for name, (_, _, seconds) in results.items():
    print(f"{name}: {seconds:.1f} s")
print("gradient steps per kept SGLD draw, as each chain chose:", THINNING)

# %% [markdown]
# SGLD takes a little less wall time than NUTS here, and the table below gives it about 1.2
# times NUTS's effective draws per second. How it gets there, and where it could not:
#
# * **What the run asked for.** SGLD was asked for 1000 kept draws per chain, and each chain
#   chose a thinning that makes a kept draw close to an independent one: the gradient steps per
#   kept draw printed above are the chains' measured autocorrelation times. That comes to about
#   14,000 gradient steps per chain for the kept draws, after 4000 warm-up steps, on a model of
#   three parameters; `MCMC` ran the two chains one after the other. The table below shows what
#   that bought: SGLD's 2000 kept draws are worth about 1800 to 2000 effective draws.
# * **Steps as large as the bias allows.** SGLD has no accept/reject step, so its step is kept
#   small enough that the discretisation bias stays at a few per cent of the posterior variance.
#   Its default integrator (Leimkuhler and Matthews': the noise of a step is the average of two
#   successive Gaussian draws) has no such bias on a Gaussian posterior, so the warm-up gives it
#   ten times the step that Welling and Teh's Euler update may take (`SGLD(...,
#   integrator="euler")`). Here its chains chose 14 gradient steps per kept draw; with Euler's
#   update they chose more than 60.
# * **Small data.** On 30 points a full-data gradient costs no more than a minibatch one, so
#   NUTS's trajectories are cheap. The minibatch gradient pays off when the data are large: the
#   cost of an SGLD step stays at $B$ rows while each NUTS leapfrog step reads all $N$ (the
#   "Performance and tuning" page of the documentation measures effective draws per second
#   against NUTS).
#
# To spend less:
#
# * **Ask for the draws you need.** Each kept draw costs a thinning's worth of gradient steps
#   and is worth about one effective draw here, so `num_samples` sets the cost: half the
#   draws, half the sampling time. Or let the run decide: `run_chains(kernel, x, y,
#   num_chains=4, num_samples=100, target_ess=400)` starts with 100 draws per chain and draws
#   on in rounds only until the run has converged with a total ESS of 400.
# * **Run the chains side by side.** `run_chains` stacks the chains and pushes them through one
#   batched gradient per step; on a model this small the per-step overhead dominates, and the
#   "Performance and tuning" page measures 8 chains of a small network at about 1.1 to 1.6 times
#   the cost of one.
# * **Use `SGHMC`**, whose momentum moves it further per gradient step on correlated posteriors.

# %% [markdown]
# ## Traces and burn-in
#
# The dashed line marks the end of warm-up; only the draws after it are kept. The red line is
# the exact posterior mean. How many draws each sampler needs to reach it depends on its step:
# random-walk proposals are small and blind to the slope of the density, an SGLD warm-up draw
# is 20 gradient steps (in the first half of its warm-up, noise-free steps whose size is
# normalised coordinate by coordinate, so it reaches the posterior in a few draws) and a kept
# draw as many as its chain's autocorrelation time, and a NUTS draw is a whole Hamiltonian
# trajectory.

# %%
fig, axes = plt.subplots(2, 3, figsize=(12, 5), sharey="row")
for col, name in enumerate(SETTINGS):
    warmup = SETTINGS[name]["warmup"]
    for chain in results[name][1]:
        for row, parameter in enumerate(["intercept", "slope"]):
            trace = [d[parameter] for d in chain]
            axes[row, col].plot(trace, lw=0.6)
    for row, parameter in enumerate(["intercept", "slope"]):
        truth = exact[parameter][0]
        axes[row, col].axvline(warmup, color="k", ls="--", lw=0.8)
        axes[row, col].axhline(truth, color="r", lw=0.8)
        axes[row, col].set_ylabel(parameter)
    axes[0, col].set_title(name)
    axes[1, col].set_xlabel("draw (warm-up included)")
fig.tight_layout()

# %% [markdown]
# ## Posterior against the exact answer
#
# Histograms of the kept draws of each sampler with the exact marginal densities. The marginal
# of each coefficient is a location-scale Student-$t$; for $\sigma$ we draw from the exact
# inverse-gamma posterior of $\sigma^2$.


# %%
def to_numpy_draws(draws):
    """Constrained draws grouped by chain -> dict of (chain, draw) numpy arrays."""
    return {
        "intercept": draws["coef"][..., 0].numpy(),
        "slope": draws["coef"][..., 1].numpy(),
        "sigma": draws["noise_var"].sqrt().numpy(),
    }


samples = {name: to_numpy_draws(results[name][0]) for name in SETTINGS}

a_n = A0 + 0.5 * N
fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
for ax, parameter in zip(axes, ["intercept", "slope", "sigma"], strict=True):
    for name in SETTINGS:
        ax.hist(samples[name][parameter].ravel(), bins=40, density=True, alpha=0.4, label=name)
    mean, sd = exact[parameter]
    if parameter == "sigma":
        reference = samples["NUTS"]["sigma"].ravel()
        grid = np.linspace(reference.min(), reference.max(), 200)
        ax.axvline(mean, color="k", lw=1.5, label="exact mean")
    else:
        scale = sd * math.sqrt((a_n - 1) / a_n)
        grid = np.linspace(mean - 4 * sd, mean + 4 * sd, 200)
        density = dist.StudentT(2 * a_n, mean, scale).log_prob(torch.as_tensor(grid)).exp()
        ax.plot(grid, density, color="k", lw=1.5, label="exact")
    ax.set_title(parameter)
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# ## Numbers
#
# For each sampler and parameter: the posterior mean and standard deviation of the kept draws,
# the exact values, the error of the mean in units of the exact standard deviation, the bulk
# effective sample size and split-$\hat R$ from ArviZ, and the effective samples per second.
# SGLD has no accept/reject step, so its standard deviations carry a step-size and minibatch
# bias; the adapted step keeps it to a few per cent of the variance, and a smaller `step_size`
# (or a `PolynomialDecay` schedule) reduces it further at the cost of more steps per effective
# draw. Below the table, each run's verdict: $\hat R \le 1.01$ and bulk and tail ESS of at
# least 100 per chain over every parameter (Vehtari et al. 2021).

# %%
rows = []
for name in SETTINGS:
    # from_draws: ArviZ's own object (InferenceData under ArviZ 0.x, DataTree under 1.x)
    diagnostics = az.summary(from_draws(samples[name]), kind="diagnostics")
    seconds = results[name][2]
    for parameter in ["intercept", "slope", "sigma"]:
        draws = samples[name][parameter]
        exact_mean, exact_sd = exact[parameter]
        rows.append(
            {
                "sampler": name,
                "parameter": parameter,
                "mean": draws.mean(),
                "exact mean": exact_mean,
                "sd": draws.std(),
                "exact sd": exact_sd,
                "|error| / exact sd": abs(draws.mean() - exact_mean) / exact_sd,
                "ESS (bulk)": diagnostics.loc[parameter, "ess_bulk"],
                "R-hat": diagnostics.loc[parameter, "r_hat"],
                "ESS / s": diagnostics.loc[parameter, "ess_bulk"] / seconds,
            }
        )
table = pd.DataFrame(rows).set_index(["sampler", "parameter"])
if SMOKE:
    print("smoke mode: short chains, noisy numbers")
display(table)
for name in SETTINGS:
    report = convergence_report(from_draws(samples[name]), name)
    print(f"{name}: {report.verdict}")


# %% [markdown]
# The last cell prints how long this whole notebook took to execute, from its first cell to its
# last. The outputs shown here come from a full-mode run on a shared two-core CPU machine, often
# under load (the tutorials' index page lists the times of all seven); on another machine, or in
# smoke mode, the time differs.

# %%
elapsed = time.perf_counter() - NOTEBOOK_START
print(f"{'smoke' if SMOKE else 'full'} mode: this notebook ran in {elapsed / 60:.1f} min")
