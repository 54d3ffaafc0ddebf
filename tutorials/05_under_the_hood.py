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
# # 5. Under the hood: update rules, friction, schedules and temperature
#
# The kernels of `pyro_sgmcmc` are thin adapters around pure update rules in
# `pyro_sgmcmc.dynamics`: functions that take a state, a gradient, a step size, a temperature and
# a `torch.Generator`, and return a new state. Because the rules are element-wise, a tensor of
# shape `(chains, dim)` runs many independent chains at once. This notebook drives the rules
# directly on 2-D targets whose answers are known. Because step sizes are the subject here, every
# step size below is given explicitly; the kernels (`SGLD`, `SGHMC`, `PSGLD`) adapt theirs during
# warm-up when none is given, as tutorials 1 to 4 and 6 do, and a given step size switches that
# adaptation off:
#
# 1. **Friction matters.** Stochastic-gradient HMC without friction ("naive" SGHMC, Chen et al.
#    2014) samples the wrong distribution when the gradient is noisy; with friction it samples
#    the right one.
# 2. **Multimodality.** A bimodal Gaussian mixture sampled by NUTS and by SGLD with a constant
#    and with a cyclical step size: how often does each chain hop between the modes?
# 3. **Step sizes and temperature.** How the step-size schedule and the temperature $T$ change
#    the spread of the draws, checked against a closed-form prediction.
#
# **Run modes.** The full configuration takes a few minutes on one CPU core. With
# `PYRO_SGMCMC_SMOKE=1` (what CI runs) fewer chains and steps are used.

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

import matplotlib.pyplot as plt
import pandas as pd
import pyro
import pyro.distributions as dist
import torch
from IPython.display import display
from pyro.infer import MCMC, NUTS

from pyro_sgmcmc.dynamics import (
    partial_momentum_refresh,
    sghmc_init,
    sghmc_step,
    sgld_init,
    sgld_step,
)
from pyro_sgmcmc.inference.schedules import Constant, CyclicalCosine, PolynomialDecay

logging.getLogger("arviz").setLevel(logging.ERROR)  # ArviZ sets its level on import

pd.options.display.float_format = "{:.3f}".format
NOTEBOOK_START = time.perf_counter()
SMOKE = os.environ.get("PYRO_SGMCMC_SMOKE", "0") == "1"
pyro.set_rng_seed(0)
generator = torch.Generator().manual_seed(0)
NUM_CHAINS = 50 if SMOKE else 400
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 1. Naive SGHMC vs SGHMC with friction
#
# The target is a correlated Gaussian $\mathcal N(0, \Sigma)$ with
# $\Sigma = \begin{pmatrix} 1 & 0.9 \\ 0.9 & 1 \end{pmatrix}$, so
# $U(\theta) = \tfrac12 \theta^\top \Sigma^{-1} \theta$. We replace the gradient by a noisy one,
# $\nabla \tilde U(\theta) = \Sigma^{-1}\theta + \zeta$ with $\zeta \sim \mathcal N(0, V I)$,
# $V = 4$, as a minibatch gradient would be.
#
# `sghmc_step` implements, in velocity units ($v = \epsilon M^{-1} p$),
#
# $$
# v_{t+1} = (1 - \alpha) v_t - \eta \nabla \tilde U(\theta_t)
#           + \sqrt{2\eta(\alpha T - \hat\beta)}\,\xi_t, \qquad
# \theta_{t+1} = \theta_t + v_{t+1},
# $$
#
# with learning rate $\eta$, friction $\alpha$ and $\hat\beta = \eta V / 2$ the part of the
# noise that the stochastic gradient already injects. Four variants, all with $\eta = 0.01$:
#
# * **HMC, exact gradient, no friction**: $\alpha = 0$ and momenta redrawn from their
#   stationary law $v \sim \mathcal N(0, \eta T I)$ every 50 steps (a Hamiltonian trajectory
#   without the Metropolis test). The reference for what the integrator alone does.
# * **naive SGHMC**: the same, with the noisy gradient. The gradient noise adds energy at every
#   step and nothing removes it, so the draws spread too wide.
# * **SGHMC with friction**: $\alpha = 0.1$, $\hat\beta = \eta V / 2$, momenta start at zero and
#   are never redrawn. Friction removes exactly the energy the noise adds.
# * **SGHMC with friction and partial momentum refresh** (Horowitz 1991): every 10 steps
#   $v \leftarrow a v + \sqrt{1-a^2}\sqrt{\eta}\,\xi$ with $a = 0.9$
#   (`partial_momentum_refresh`). The map leaves $\mathcal N(0, \eta T I)$ invariant, so it
#   must not change what is sampled; the friction step is itself such a refresh with
#   $a = 1 - \alpha$ to first order.
#
# The rules take the position and the gradient as dicts of tensors, one entry per latent site
# (here the single site `"theta"`, of shape `(chains, 2)`), and draw the injected noise $\xi_t$
# from the `torch.Generator` passed to them (their `noise=` argument takes given standard-normal
# draws instead, for exact tests). The cell below draws the gradient noise $\zeta$ and the
# refreshed momenta from that same generator, so the whole experiment is seeded by it.

# %%
COV = torch.tensor([[1.0, 0.9], [0.9, 1.0]])
PRECISION = torch.linalg.inv(COV)
GRADIENT_NOISE_VAR = 4.0
ETA = 0.01
NUM_STEPS_SGHMC = 3000 if SMOKE else 20000
RESAMPLE_EVERY = 50


def gradient_of_u(theta, noisy):
    grad = theta @ PRECISION
    if noisy:
        grad = grad + math.sqrt(GRADIENT_NOISE_VAR) * torch.randn(theta.shape, generator=generator)
    return {"theta": grad}


def run_hamiltonian(noisy, friction, gradient_noise, resample_every, persistence=0.0):
    position = {"theta": torch.zeros(NUM_CHAINS, 2)}
    state = sghmc_init(position)
    kept = []
    for t in range(NUM_STEPS_SGHMC):
        if resample_every and t % resample_every == 0:
            # v <- a v + sqrt(1 - a^2) sqrt(eta) xi: a = 0 redraws, a near 1 refreshes partially
            momentum = partial_momentum_refresh(
                state.momentum, persistence, math.sqrt(ETA), generator
            )
            state = sghmc_init(state.position, momentum)
        state = sghmc_step(
            state,
            gradient_of_u(state.position["theta"], noisy),
            ETA,
            friction,
            1.0,
            generator,
            gradient_noise=gradient_noise,
        )
        if t >= NUM_STEPS_SGHMC // 2 and t % 10 == 0:
            kept.append(state.position["theta"])
    return torch.stack(kept).reshape(-1, 2)


hamiltonian_variants = {
    "HMC, exact gradient, no friction": run_hamiltonian(False, 0.0, 0.0, RESAMPLE_EVERY),
    "naive SGHMC (noisy, no friction)": run_hamiltonian(True, 0.0, 0.0, RESAMPLE_EVERY),
    "SGHMC with friction (noisy)": run_hamiltonian(
        True, 0.1, ETA * GRADIENT_NOISE_VAR / 2, resample_every=0
    ),
    "SGHMC + partial refresh (a = 0.9)": run_hamiltonian(
        True, 0.1, ETA * GRADIENT_NOISE_VAR / 2, resample_every=10, persistence=0.9
    ),
}

# %%
grid = torch.linspace(-4, 4, 120)
gx, gy = torch.meshgrid(grid, grid, indexing="xy")
points = torch.stack([gx, gy], dim=-1)
target_density = dist.MultivariateNormal(torch.zeros(2), COV).log_prob(points).exp()
# Contours where the Mahalanobis distance is 3, 2 and 1 (density relative to the peak).
SIGMA_LEVELS = [float(target_density.max()) * math.exp(-0.5 * r**2) for r in (3, 2, 1)]

fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), sharex=True, sharey=True)
for ax, (name, draws) in zip(axes, hamiltonian_variants.items(), strict=True):
    shown = draws[torch.randperm(len(draws), generator=generator)[:2000]]
    ax.scatter(shown[:, 0], shown[:, 1], s=2, alpha=0.3)
    ax.contour(gx, gy, target_density, levels=SIGMA_LEVELS, colors="k", linewidths=0.8)
    ax.set_title(name, fontsize=10)
    ax.set_xlim(-4.5, 4.5)
    ax.set_ylim(-4.5, 4.5)
fig.suptitle("draws (blue) against the target's density contours (black)")
fig.tight_layout()


# %% [markdown]
# We measure each variant by the sample covariance and by the Kullback-Leibler divergence
# $\mathrm{KL}(\mathcal N(\hat\mu, \hat\Sigma) \,\|\, \mathcal N(0, \Sigma))$ of a Gaussian fitted
# to the draws (0 for a perfect sampler).


# %%
def gaussian_kl_to_target(draws):
    mean = draws.mean(0)
    cov = torch.cov(draws.T)
    trace_term = torch.trace(PRECISION @ cov)
    quad = mean @ PRECISION @ mean
    logdet = torch.logdet(COV) - torch.logdet(cov)
    return float(0.5 * (trace_term + quad - 2 + logdet))


def covariance_row(name, draws):
    cov = torch.cov(draws.T)
    return {
        "sampler": name,
        "var θ1": float(cov[0, 0]),
        "var θ2": float(cov[1, 1]),
        "corr": float(cov[0, 1] / (cov[0, 0] * cov[1, 1]).sqrt()),
        "KL to target": gaussian_kl_to_target(draws),
    }


friction_table = pd.DataFrame(
    [{"sampler": "target", "var θ1": 1.0, "var θ2": 1.0, "corr": 0.9, "KL to target": 0.0}]
    + [covariance_row(name, draws) for name, draws in hamiltonian_variants.items()]
).set_index("sampler")
friction_table

# %% [markdown]
# ## 2. A bimodal target: NUTS vs cyclical SGLD
#
# An equal mixture of $\mathcal N((2, -2), I)$ and $\mathcal N((-2, 2), I)$. Between the modes
# the density drops by a factor of about $e^{4}$, so a local sampler must cross a region of low
# probability to move from one mode to the other.
#
# * **NUTS** (Pyro), one chain per row below, adapting its step size during warm-up.
# * **SGLD, constant step** $\epsilon = 0.05$.
# * **cyclical SGLD** with `CyclicalCosine(initial=1.0, cycle_length=200,
#   exploration_fraction=0.5)`. In the first half of each cycle the step is large and the noise
#   is switched off (exploration, as in Zhang et al. 2020): the chain descends to a mode. In the
#   second half the noise is on and the step shrinks from 0.5 to 0; draws are kept only there.
#   The `pyro_sgmcmc` kernels follow `schedule.is_sampling(t)` in exactly this way; here we do
#   it by hand.
#
# We count the *hops*: how many times the label of the nearest mode changes along a chain's kept
# draws, and the fraction of draws in the mode at $(2, -2)$ (0.5 for the exact target).

# %%
MODES = torch.tensor([[2.0, -2.0], [-2.0, 2.0]])
mixture = dist.MixtureSameFamily(
    dist.Categorical(torch.ones(2)),
    dist.MultivariateNormal(MODES, torch.eye(2).expand(2, 2, 2)),
)


def mixture_gradient(theta):
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(-mixture.log_prob(theta).sum(), theta)
    return {"theta": grad}


def run_sgld(schedule, num_steps, thin, temperature=1.0, num_chains=NUM_CHAINS):
    """SGLD on the mixture, chains started in one mode; keep draws in sampling phases only."""
    start = MODES[0] + 0.1 * torch.randn(num_chains, 2, generator=generator)
    state = sgld_init({"theta": start})
    kept = []
    for t in range(num_steps):
        sampling = schedule.is_sampling(t)
        step_temperature = temperature if sampling else 0.0
        state = sgld_step(
            state,
            mixture_gradient(state.position["theta"]),
            schedule(t),
            step_temperature,
            generator,
        )
        if sampling and t % thin == 0:
            kept.append(state.position["theta"].clone())
    return torch.stack(kept, dim=1)  # (chains, draws, 2)


def nearest_mode(draws):
    return (draws @ (MODES[0] - MODES[1]) > 0).long()  # 1 for the mode at (2, -2)


def hop_row(name, draws, seconds_per_chain=None):
    label = nearest_mode(draws)
    hops = (label[:, 1:] != label[:, :-1]).sum(dim=1).float()
    return {
        "sampler": name,
        "kept draws per chain": draws.shape[1],
        "hops per chain (mean)": float(hops.mean()),
        "chains that never hop": float((hops == 0).float().mean()),
        "fraction in mode (2,-2)": float(label.float().mean()),
    }


NUM_STEPS_MIXTURE = 2000 if SMOKE else 20000
sgld_draws = {
    "SGLD, constant ε = 0.05": run_sgld(Constant(0.05), NUM_STEPS_MIXTURE, thin=10),
    "cyclical SGLD, ε0 = 1": run_sgld(
        CyclicalCosine(initial=1.0, cycle_length=200, exploration_fraction=0.5),
        NUM_STEPS_MIXTURE,
        thin=5,
    ),
}


# %%
def mixture_model():
    # torch registers no bijection to the reals for MixtureSameFamily's support, so theta is
    # drawn from a broad Normal and a factor swaps that density for the mixture's.
    broad = dist.Normal(0.0, 10.0).expand([2]).to_event(1)
    theta = pyro.sample("theta", broad)
    pyro.factor("mixture", mixture.log_prob(theta) - broad.log_prob(theta))


NUTS_CHAINS = 2 if SMOKE else 4
nuts_runs = []
for chain in range(NUTS_CHAINS):
    pyro.set_rng_seed(100 + chain)
    mcmc = MCMC(
        NUTS(mixture_model),
        num_samples=200 if SMOKE else 1000,
        warmup_steps=100 if SMOKE else 500,
        initial_params={"theta": MODES[0].clone()},
        disable_progbar=True,
    )
    mcmc.run()
    nuts_runs.append(mcmc.get_samples()["theta"])
nuts_draws = torch.stack(nuts_runs)

mixture_table = pd.DataFrame(
    [hop_row(f"NUTS ({NUTS_CHAINS} chains)", nuts_draws)]
    + [hop_row(f"{name} ({NUM_CHAINS} chains)", d) for name, d in sgld_draws.items()]
).set_index("sampler")
mixture_table

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), sharex=True, sharey=True)
mixture_density = mixture.log_prob(points).exp()
# each mode holds half the mass: contours at 3, 2 and 1 sd from a mode
MIXTURE_LEVELS = [0.5 * math.exp(-0.5 * r**2) / (2 * math.pi) for r in (3, 2, 1)]
panels = {"NUTS": nuts_draws, **sgld_draws}
for ax, (name, draws) in zip(axes, panels.items(), strict=True):
    chain = draws[0]
    ax.contour(
        gx,
        gy,
        mixture_density,
        levels=MIXTURE_LEVELS,
        colors="k",
        linewidths=0.6,
    )
    ax.plot(chain[:, 0], chain[:, 1], lw=0.3, alpha=0.6)
    ax.scatter(chain[:, 0], chain[:, 1], s=3)
    ax.set_title(f"{name}: one chain", fontsize=10)
    ax.set_xlim(-5, 5)
    ax.set_ylim(-5, 5)
fig.tight_layout()

# %% [markdown]
# ## 3. Step sizes and temperature
#
# On a Gaussian target the effect of a finite step size is exact. For SGLD on
# $U(\theta) = \tfrac12 \lambda \theta^2$ with a constant step $\epsilon$ and temperature $T$,
# $\theta_{t+1} = (1 - \epsilon\lambda)\theta_t + \sqrt{2\epsilon T}\,\xi_t$ has the stationary
# variance
#
# $$
# \operatorname{Var}_\infty[\theta] = \frac{T}{\lambda\,(1 - \epsilon\lambda/2)},
# $$
#
# so the draws are too wide by the factor $1/(1 - \epsilon\lambda/2)$, which vanishes as
# $\epsilon \to 0$ and diverges at $\epsilon\lambda = 2$ (the stability limit). $T$ scales the
# variance: $T < 1$ sharpens the posterior ("cold"), $T > 1 $ flattens it. We check this along
# the two principal axes of the correlated Gaussian of part 1 (eigenvalues of
# $\Sigma^{-1}$: $\lambda = 1/1.9$ and $\lambda = 1/0.1 = 10$), and show what a decaying
# (Welling & Teh) and a cyclical schedule do.
#
# The last row swaps Welling and Teh's Euler step for Leimkuhler and Matthews' (`sgld_step(...,
# integrator="leimkuhler_matthews")`, the default of the `SGLD` and `PSGLD` kernels): the same
# gradient, with the noise $\tfrac12(\xi_{t-1} + \xi_t)$ instead of $\xi_t$. On a Gaussian its
# stationary variance is exactly $T/\lambda$ at any step below the stability limit, so the
# factor $1/(1 - \epsilon\lambda/2)$ disappears.

# %%
eigenvalues, eigenvectors = torch.linalg.eigh(PRECISION)
NUM_STEPS_SCHEDULES = 4000 if SMOKE else 40000


def run_sgld_gaussian(schedule, temperature, integrator):
    state = sgld_init({"theta": torch.zeros(NUM_CHAINS, 2)})
    kept = []
    for t in range(NUM_STEPS_SCHEDULES):
        sampling = schedule.is_sampling(t)
        gradient = {"theta": state.position["theta"] @ PRECISION}
        heat = temperature if sampling else 0.0
        state = sgld_step(state, gradient, schedule(t), heat, generator, integrator=integrator)
        if sampling and t >= NUM_STEPS_SCHEDULES // 2 and t % 5 == 0:
            kept.append(state.position["theta"])
    draws = torch.stack(kept).reshape(-1, 2)
    return draws @ eigenvectors  # coordinates along the principal axes


def predicted_variance(step_size, temperature, integrator="euler"):
    if integrator == "leimkuhler_matthews":  # exact at any stable step
        return temperature / eigenvalues
    return temperature / (eigenvalues * (1 - step_size * eigenvalues / 2))


LM = "leimkuhler_matthews"
configurations = [  # (row, schedule, T, the constant step if any, integrator)
    ("constant ε = 0.01, T = 1", Constant(0.01), 1.0, 0.01, "euler"),
    ("constant ε = 0.1, T = 1", Constant(0.1), 1.0, 0.1, "euler"),
    ("constant ε = 0.18, T = 1", Constant(0.18), 1.0, 0.18, "euler"),
    ("constant ε = 0.01, T = 0.25", Constant(0.01), 0.25, 0.01, "euler"),
    ("constant ε = 0.01, T = 4", Constant(0.01), 4.0, 0.01, "euler"),
    (
        "polynomial 0.1(1+t/100)^-0.55, T = 1",
        PolynomialDecay(a=1.26, b=100.0, gamma=0.55),
        1.0,
        None,
        "euler",
    ),
    ("cyclical ε0 = 0.18, L = 400, T = 1", CyclicalCosine(0.18, 400, 0.5), 1.0, None, "euler"),
    ("Leimkuhler-Matthews, constant ε = 0.18, T = 1", Constant(0.18), 1.0, 0.18, LM),
]
schedule_rows = []
for name, schedule, temperature, constant_step, integrator in configurations:
    draws = run_sgld_gaussian(schedule, temperature, integrator)
    variance = draws.var(dim=0)
    row = {
        "setting": name,
        "var along λ=0.53": float(variance[0]),
        "var along λ=10": float(variance[1]),
        "exact posterior (T=1, ε→0)": f"{1 / eigenvalues[0]:.3f} / {1 / eigenvalues[1]:.3f}",
    }
    if constant_step is not None:
        predicted = predicted_variance(constant_step, temperature, integrator)
        row["predicted for this ε, T"] = f"{predicted[0]:.3f} / {predicted[1]:.3f}"
    else:
        row["predicted for this ε, T"] = "n/a (step varies)"
    schedule_rows.append(row)
schedule_table = pd.DataFrame(schedule_rows).set_index("setting")
schedule_table

# %% [markdown]
# The decaying schedule starts at $1.26 \cdot 101^{-0.55} \approx 0.1$ and shrinks the bias as the
# step decays, at the price of slower mixing; the cyclical schedule keeps draws only from the
# second half of each cycle, where the step has already fallen below half of $\epsilon_0$.
#
# ## Numbers
#
# What the three tables above say:
#
# * **Friction (part 1).** Without a Metropolis test the integrator alone, on the exact
#   gradient, is already a little off (variances 0.904, correlation 0.953, KL 0.140). The
#   gradient noise without friction makes that far worse: variances 3.77 instead of 1, KL 3.86,
#   the energy the noise adds. With friction the draws match the target (variances 1.00,
#   correlation 0.897, KL 0.000 to three decimals), and a partial momentum refresh leaves that
#   so (0.988, 0.898, 0.000).
# * **Mode hopping (part 2).** Every chain of every sampler hops between the modes at least
#   once. Per kept draw, cyclical SGLD hops most (26.9 hops in 2000 draws, 13.5 per 1000,
#   against 16.1 for SGLD with a constant step and 11.0 in 1000 draws for NUTS), and its fraction
#   in the mode at $(2, -2)$, 0.517, is closest to the exact 0.5; NUTS's 0.562 rests on four
#   chains only.
# * **Step size and temperature (part 3).** Every constant-step row is within 2% of the
#   closed-form prediction (the largest gap is 1.5%), including the bias: at $\epsilon = 0.18$ the
#   stiff direction's variance is 1.001 against a predicted 1.000, ten times the exact 0.100. $T$
#   scales the variance as predicted (0.474 / 0.026 at $T = 0.25$, 7.570 / 0.422 at $T = 4$). The
#   decaying schedule gives 1.927 / 0.102 and the cyclical one 1.804 / 0.125, against the exact
#   1.900 / 0.100. Leimkuhler and Matthews' step at the same $\epsilon = 0.18$ gives
#   1.898 / 0.100: the factor ten is gone, at the cost of the same one gradient per step.
#
# The cell below collects the key number of each part in one table, next to its reference: the
# KL divergence without and with friction (0 for an exact sampler); cyclical SGLD's hops per 1000
# kept draws (so that chains of different lengths compare) against NUTS's, and its fraction of
# draws in the mode at $(2, -2)$; the stiff direction's variance at $\epsilon = 0.18$ against
# the closed form, Euler's and Leimkuhler and Matthews', and the largest relative gap between a
# constant-step row's variance and its prediction, along either axis.

# %%
if SMOKE:
    print("smoke mode: fewer chains and steps, noisier numbers")

kl = friction_table["KL to target"]
hops_per_1000 = (
    1000 * mixture_table["hops per chain (mean)"] / mixture_table["kept draws per chain"]
)
nuts_name, _, cyclical_name = mixture_table.index
gaps = []  # measured / predicted - 1, along both axes, for every constant-step row
for name, _, temperature, step, integrator in configurations:
    if step is not None:
        measured = schedule_table.loc[name, ["var along λ=0.53", "var along λ=10"]]
        predicted = predicted_variance(step, temperature, integrator)
        gaps += [float(m) / float(q) - 1 for m, q in zip(measured, predicted, strict=True)]

summary = pd.DataFrame(
    [
        (
            "1. friction",
            "KL to target, naive SGHMC",
            kl["naive SGHMC (noisy, no friction)"],
            0.0,
            "exact sampler",
        ),
        (
            "1. friction",
            "KL to target, SGHMC with friction",
            kl["SGHMC with friction (noisy)"],
            0.0,
            "exact sampler",
        ),
        (
            "2. two modes",
            "hops per 1000 kept draws, cyclical SGLD",
            hops_per_1000[cyclical_name],
            hops_per_1000[nuts_name],
            "NUTS",
        ),
        (
            "2. two modes",
            "fraction in mode (2,-2), cyclical SGLD",
            mixture_table.loc[cyclical_name, "fraction in mode (2,-2)"],
            0.5,
            "exact target",
        ),
        (
            "3. step size",
            "var along λ=10, ε = 0.18",
            schedule_table.loc["constant ε = 0.18, T = 1", "var along λ=10"],
            float(predicted_variance(0.18, 1.0)[1]),
            "closed form",
        ),
        (
            "3. step size",
            "var along λ=10, ε = 0.18, Leimkuhler-Matthews",
            schedule_table.loc["Leimkuhler-Matthews, constant ε = 0.18, T = 1", "var along λ=10"],
            float(predicted_variance(0.18, 1.0, LM)[1]),
            "exact posterior",
        ),
        (
            "3. step size",
            "largest relative gap, constant steps",
            max(abs(gap) for gap in gaps),
            0.0,
            "closed form",
        ),
    ],
    columns=["part", "quantity", "measured", "reference", "reference is"],
).set_index(["part", "quantity"])
display(summary)


# %% [markdown]
# The last cell prints how long this whole notebook took to execute, from its first cell to its
# last. The outputs shown here come from a full-mode run on a shared two-core CPU machine, often
# under load (the tutorials' index page lists the times of all seven); on another machine, or in
# smoke mode, the time differs.

# %%
elapsed = time.perf_counter() - NOTEBOOK_START
print(f"{'smoke' if SMOKE else 'full'} mode: this notebook ran in {elapsed / 60:.1f} min")
