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
# # 4. Image classification: SGHMC, SGLD, a MAP fit, Constant SGD and SVI
#
# A 784-100-10 network with sigmoid hidden units on Fashion-MNIST (60 000 training images of
# clothing, 10 classes), with Neal's hierarchical prior: every weight group (each layer's weights,
# each layer's biases) has its own precision $\lambda_g$ with a Gamma hyperprior,
#
# $$
# \lambda_g \sim \mathrm{Gamma}(\alpha, \beta), \qquad w_{gj} \mid \lambda_g \sim
# \mathcal N(0, \lambda_g^{-1}),
# $$
#
# and the SG-MCMC kernels resample each $\lambda_g$ from its exact conditional
# $\mathrm{Gamma}(\alpha + n_g/2, \beta + \lVert w_g \rVert^2 / 2)$ once per epoch (a Gibbs step
# that `BayesianMLP.gibbs_updates()` hands to the kernel automatically).
#
# We compare
#
# * **SGHMC** (Chen, Fox & Guestrin 2014, stepped with Leimkuhler & Matthews' BAOAB splitting,
#   its default) and **SGLD** (Welling & Teh 2011, with Leimkuhler &
#   Matthews' integrator, its default), from `pyro_sgmcmc`, on minibatches of 100 images (500
#   on Fashion-MNIST);
# * **a MAP fit**: the optimisation baseline, the mode of the posterior found by minibatch Adam
#   (`find_map`), labelled "MAP (Adam)" in the table and the figures;
# * **Constant SGD** (Mandt, Hoffman & Blei 2017): SGD with a constant rate and no injected
#   noise, whose iterates are read as posterior draws; `ConstantSGD` estimates the gradient noise
#   during warm-up and then uses their optimal rate $\eta^* = 2BD / (N^2 \operatorname{Tr} C)$;
# * **SVI**: a mean-field Gaussian guide (`fit_svi`);
#
# on test accuracy, negative log-likelihood (NLL) and expected calibration error (ECE), on how
# often each refuses to classify pure-noise images (maximum predictive probability below 0.2),
# and on what the weight posteriors look like.
#
# **Data and run modes.** Fashion-MNIST is read from the IDX files of the Debian package
# `dataset-fashion-mnist` (`/usr/share/datasets/fashion-mnist`, or the folder in
# `$PYRO_SGMCMC_FASHION_MNIST`). The full configuration takes eight to fifteen minutes on one CPU
# core. In smoke mode (`PYRO_SGMCMC_SMOKE=1`, what CI runs) the same network is
# fitted with short chains on a random subset of 3000 training and 1000 test images. Only where
# the files are not installed does the notebook fall back to scikit-learn's 8x8 `digits` (1797
# images, a 64-50-10 network); the first output below says which data it used.

# %%
import logging
import warnings

# Keep the outputs to results: tqdm warns that ipywidgets is missing, Pyro that a machine with
# few cores runs the chains one after the other, ArviZ (below) that one chain has no R-hat.
warnings.filterwarnings("ignore", message="IProgress not found")
warnings.filterwarnings("ignore", message="num_chains=.*sequentially")

import contextlib
import os
import time

import matplotlib.pyplot as plt
import pandas as pd
import pyro
import torch
from IPython.display import display
from pyro.infer import MCMC

from pyro_sgmcmc import SGHMC, SGLD, ConstantSGD, SamplerDivergedError
from pyro_sgmcmc.analysis.metrics import (
    accuracy,
    expected_calibration_error,
    negative_log_likelihood,
)
from pyro_sgmcmc.analysis.predictive import classify_with_cutoff, posterior_predictive, sample_guide
from pyro_sgmcmc.data.datasets import load_dataset
from pyro_sgmcmc.errors import SamplerWarning
from pyro_sgmcmc.models.initialization import find_map
from pyro_sgmcmc.nn import BayesianMLP, GammaPrecision
from pyro_sgmcmc.variational.svi import fit_svi

logging.getLogger("arviz").setLevel(logging.ERROR)  # ArviZ sets its level on import

pd.options.display.float_format = "{:.3f}".format
NOTEBOOK_START = time.perf_counter()
SMOKE = os.environ.get("PYRO_SGMCMC_SMOKE", "0") == "1"
pyro.set_rng_seed(0)

try:
    subset = {"max_train": 3000, "max_test": 1000} if SMOKE else {}
    data = load_dataset("fashion_mnist", seed=0, **subset)
except FileNotFoundError:
    print(
        "Fashion-MNIST is not installed here (apt-get install dataset-fashion-mnist): "
        "using scikit-learn's 8x8 digits instead."
    )
    data = load_dataset("digits", seed=0)
print("smoke mode" if SMOKE else "full mode", data)

FASHION = data.name == "fashion_mnist"
HIDDEN = 100 if FASHION else 50
BATCH = 500 if FASHION else 100
EPOCH = data.num_train // BATCH  # gradient steps per pass over the data
# Each kept draw is one epoch of gradient steps. The adaptive warm-up needs a few hundred warm-up
# gradient steps (WARMUP * STEPS_PER_DRAW); the MAP fit runs MAP_EPOCHS passes over the data.
if SMOKE:
    WARMUP, DRAWS, STEPS_PER_DRAW, MAP_EPOCHS, SVI_EPOCHS = 60, 60, EPOCH, 20, 30
else:
    WARMUP, DRAWS, STEPS_PER_DRAW, MAP_EPOCHS, SVI_EPOCHS = 20, 200, EPOCH, 40, 100
print(f"{HIDDEN} hidden units, batches of {BATCH}, {EPOCH} steps per epoch")

# %% [markdown]
# ## Model
#
# `GammaPrecision(1.0, 1.0)` puts one precision on each of the four weight groups. The
# categorical head takes the 10 logits. Each method gets a fresh model object.
#
# Every fit here targets the posterior itself. To sharpen the predictive of a model with a
# hierarchical prior like this one, temper the *likelihood*, not the posterior:
# `BayesianMLP(..., likelihood_temperature=0.02)` targets $p(\theta)\, p(y \mid \theta)^{50}$ and
# keeps the Gibbs updates of the precisions proper, whereas a cold posterior (`temperature < 1`
# in the kernel) makes the precisions run away and collapses the first layer. On the full data
# set, with 40 epochs of SGD as a warm start and a hand-given step (`learning_rate=0.02`), that
# setting reached accuracy 0.894, NLL 0.293 and ECE 0.008 in about three minutes of SGHMC with
# four chains (the "Performance and tuning" page of the documentation, under Temperature; the
# run is described in `benchmarks/README.md`).

# %%
x, y = data.x_train, data.y_train


def make_model():
    return BayesianMLP(
        data.num_features,
        [HIDDEN],
        10,
        activation="sigmoid",
        likelihood="categorical",
        prior=GammaPrecision(1.0, 1.0),
    )


print(make_model().latent_sites)

# %% [markdown]
# ## Five fits
#
# No step size is given to the samplers. As NUTS adapts its step size and mass matrix, SGHMC,
# SGLD and Constant SGD adapt theirs during the warm-up draws (in full mode 20 draws of 120
# gradient steps): the first half of the warm-up descends towards the posterior without injected
# noise, the second half measures each weight's curvature and minibatch-gradient noise and sets
# a step size and a diagonal preconditioner, which are then frozen (the "Adaptive warm-up" page
# of the documentation). Constant SGD then switches to Mandt et al.'s optimal rate. Each kept
# draw is one epoch of gradient steps; the warm-up draws are discarded. In full mode the MAP fit
# is 40 epochs of minibatch Adam and SVI 100 epochs.
#
# The kernels check the health of every chain (for example, a network that has not left its
# starting point after warm-up) and report a problem with a `SamplerWarning`; here such a
# message is printed with the results.

# %%
fits, seconds = {}, {}


@contextlib.contextmanager
def sampler_messages(name):
    """Print the sampler's health messages (``SamplerWarning``) as results."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplerWarning)
        yield
    for caught_warning in caught:
        if issubclass(caught_warning.category, SamplerWarning):
            print(f"{name}, message from the sampler: {caught_warning.message}")
        else:
            warnings.warn(caught_warning.message, caught_warning.category, stacklevel=1)


model = make_model()
start = time.perf_counter()
mcmc = MCMC(
    SGHMC(model, batch_size=BATCH, num_steps_per_sample=STEPS_PER_DRAW, seed=0),
    num_samples=DRAWS,
    warmup_steps=WARMUP,
    disable_progbar=True,
)
with sampler_messages("SGHMC"):
    mcmc.run(x, y)
seconds["SGHMC"] = time.perf_counter() - start
fits["SGHMC"] = (model, mcmc.get_samples())

model = make_model()
start = time.perf_counter()
mcmc = MCMC(
    SGLD(model, batch_size=BATCH, num_steps_per_sample=STEPS_PER_DRAW, seed=1),
    num_samples=DRAWS,
    warmup_steps=WARMUP,
    disable_progbar=True,
)
with sampler_messages("SGLD"):
    mcmc.run(x, y)
seconds["SGLD"] = time.perf_counter() - start
fits["SGLD"] = (model, mcmc.get_samples())

model = make_model()
start = time.perf_counter()
map_values = find_map(
    model,
    x,
    y,
    num_steps=MAP_EPOCHS * EPOCH,
    batch_size=BATCH,
    learning_rate=1e-2,
    seed=2,
    return_values=True,
)
seconds["MAP (Adam)"] = time.perf_counter() - start
fits["MAP (Adam)"] = (model, {k: v.detach()[None] for k, v in map_values.items()})

model = make_model()
start = time.perf_counter()
mcmc = MCMC(
    ConstantSGD(model, batch_size=BATCH, num_steps_per_sample=STEPS_PER_DRAW, seed=5),
    num_samples=DRAWS,
    warmup_steps=WARMUP,
    disable_progbar=True,
)
# A sampler that diverges is a result too: it is reported in the table instead of stopping here.
diverged = {}
try:
    with sampler_messages("Constant SGD"):
        mcmc.run(x, y)
except SamplerDivergedError as error:
    diverged["Constant SGD"] = time.perf_counter() - start
    print("Constant SGD diverged:", str(error).split(". ")[0])
else:
    seconds["Constant SGD"] = time.perf_counter() - start
    fits["Constant SGD"] = (model, mcmc.get_samples())
    (rate,) = mcmc.diagnostics()["optimal_rate"].values()  # one chain: {"chain 0": rate}
    print(f"optimal constant rate (full-gradient units): {rate:.3g}")

model = make_model()
svi_result = fit_svi(
    model,
    x,
    y,
    num_steps=SVI_EPOCHS * EPOCH,
    batch_size=BATCH,
    learning_rate=1e-2,
    progress_bar=False,
    seed=3,
)
seconds["SVI"] = svi_result.wall_times[0]
fits["SVI"] = (model, sample_guide(svi_result.guides[0], DRAWS, x, y))

# %% [markdown]
# ## Noise images
#
# Images whose pixels are drawn uniformly over the range of the training pixels, standardised
# like the data. A model that knows what it does not know should spread its probability over
# the classes; `classify_with_cutoff` refuses (label $-1$) every input whose largest predictive
# probability is below 0.2.

# %%
generator = torch.Generator().manual_seed(4)
pixels = data.x_to_original(x)
low, high = float(pixels.min()), float(pixels.max())
noise_original = low + (high - low) * torch.rand(500, data.num_features, generator=generator)
noise = (noise_original - data.x_mean) / data.x_scale

predictions, noise_predictions = {}, {}
for name, (model, draws) in fits.items():
    predictions[name] = posterior_predictive(model, draws, data.x_test, data.y_test)
    noise_predictions[name] = posterior_predictive(model, draws, noise)

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for name in fits:
    axes[0].hist(
        predictions[name].probs.max(-1).values, bins=30, range=(0, 1), alpha=0.5, label=name
    )
    axes[1].hist(
        noise_predictions[name].probs.max(-1).values, bins=30, range=(0, 1), alpha=0.5, label=name
    )
for ax, title in zip(axes, ["test images", "noise images"], strict=True):
    ax.axvline(0.2, color="k", ls="--", lw=1)
    ax.set(xlabel="max predictive probability", title=title)
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# ## Weight posteriors
#
# Histograms of the first-layer weights pooled over draws, and the sampled precision of that
# layer. The Gibbs-sampled precision shrinks weights that the data do not support; SVI's
# mean-field guide keeps each weight's own mean and scale.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
for name in ["SGHMC", "SGLD", "SVI"]:
    draws = fits[name][1]
    axes[0].hist(
        draws["layers.0.weight"].flatten().numpy(),
        bins=100,
        density=True,
        histtype="step",
        label=name,
    )
    axes[1].plot(draws["layers.0.weight_precision"].numpy(), label=name)
axes[0].hist(
    fits["MAP (Adam)"][1]["layers.0.weight"].flatten().numpy(),
    bins=100,
    density=True,
    histtype="step",
    color="k",
    label="MAP (Adam), a point",
)
axes[0].set(xlabel="weight, layer 0", yscale="log", title="first-layer weights")
axes[1].set(xlabel="kept draw", ylabel="λ of layer-0 weights", title="precision draws")
axes[0].legend()
fig.tight_layout()

# %% [markdown]
# ## Numbers
#
# Test accuracy, NLL (mean per image) and ECE (15 bins), the share of test and noise images
# refused by the 0.2 cut-off, the accuracy on the test images that were not refused, and the
# wall-clock seconds of each fit (a method that diverged has only its seconds).

# %%
rows = []
for name, prediction in predictions.items():
    labels = classify_with_cutoff(prediction.probs, 0.2)
    accepted = labels >= 0
    noise_labels = classify_with_cutoff(noise_predictions[name].probs, 0.2)
    rows.append(
        {
            "method": name,
            "accuracy": accuracy(prediction.probs, data.y_test),
            "NLL": negative_log_likelihood(prediction.probs, data.y_test),
            "ECE": expected_calibration_error(prediction.probs, data.y_test),
            "test refused": float((~accepted).float().mean()),
            "noise refused": float((noise_labels < 0).float().mean()),
            "accuracy when accepted": float(
                (labels[accepted] == data.y_test[accepted]).float().mean()
            ),
            "λ, layer-0 weights": float(fits[name][1]["layers.0.weight_precision"].mean()),
            "seconds": seconds[name],
        }
    )
rows += [{"method": f"{name} (diverged)", "seconds": t} for name, t in diverged.items()]
table = pd.DataFrame(rows).set_index("method")
print(
    f"data: {data.name}, {data.num_train} training and {data.num_test} test images"
    + (" (smoke mode: short runs)" if SMOKE else "")
    + ("" if FASHION else ", in place of Fashion-MNIST")
)
display(table)

# %% [markdown]
# ## Reading the table
#
# The two optimisers score lowest, and the column $\lambda$ (the precision of the first-layer
# weights, averaged over draws) says why. The row "MAP (Adam)" is the mode of the posterior of the
# hierarchical model, found by Adam: it maximises the joint density of the weights *and* their
# precisions, and with 78,400 first-layer weights the term $\lambda^{n_g/2}$ of that density
# rewards shrinking them all together: the mode drives $\lambda$ up by orders of magnitude and the
# weights towards zero, and the network underfits. (A prior with fixed scales has no precision to
# drive up: `NormalPrior(1.0)` in place of `GammaPrecision(1.0, 1.0)` in `make_model` is the
# experiment that separates this effect from the optimiser; it is not run here.) The samplers
# average over $\lambda$ instead of maximising over it, and keep the first layer alive. Constant
# SGD is SGD at a constant rate around a mode of the same density, and inherits what that mode
# does to the first layer. Optimisation on a hierarchical prior is the classic place where a point
# estimate and the posterior part ways; SVI, which optimises a distribution, sits between the two.
#
# The column "noise refused" is 0.000 for every method, and the cut-off says why.
# `classify_with_cutoff` refuses an image only when its largest predictive probability is below
# 0.2. With ten classes the largest probability is at least 0.1 (a flat prediction), and it falls
# below 0.2 only when the probability is spread over six classes or more. None of these networks
# does that for a noise image: in the right panel of the histograms above every noise image lies
# to the right of the dashed line at 0.2. The sigmoid network has only ever seen clothes, and it
# maps uniform noise to a few classes with confidence. Averaging over the posterior tempers that
# only in part: in this run the samplers put most noise images between 0.75 and 1, the MAP fit
# between 0.65 and 0.85 and SVI between 0.4 and 0.65; Constant SGD stays lowest (mostly 0.25 to
# 0.35), as it is unsure of many test images too (left panel). A refusal at 0.2 is thus no
# test of whether these models know what they do not know; tutorial 7 sweeps the cut-off for a
# convolutional network, where a higher one refuses most noise images at the price of some test
# images.
#
# **The sampler messages.** Each sampler judges its chain on the network's outputs $f(x)$ (for a
# classifier, its class probabilities, the softmax of the logits), and all three printed a
# `not converged` message under the fits: in 200 kept draws the bulk ESS of $f(x)$ is 1 for
# SGHMC and SGLD and 23 for Constant SGD, where 100 is asked for (by their own estimate they
# would need a run about 74 and 5 times longer). The precision draws above show the
# reason, and SGHMC's and SGLD's first messages say it too: the $\lambda$ of the first layer is
# still trending down at the end of the run (its mean over the last quarter of the kept draws
# lies 80 to 100 draw-to-draw fluctuations from that over the first quarter), so the chains
# drift and have not settled. The rows of the samplers are therefore what one chain gives in this
# budget, averaged along that drift, not a converged posterior predictive;
# `pyro_sgmcmc.run_chains(kernel, ..., target_ess=400)` draws until the ESS is reached. Constant
# SGD also reports that about 2,300 of the 78,400 first-layer weights did not move during
# sampling (their spread over the draws is about a thousandth of a posterior standard
# deviation): for those weights its draws are a single point.


# %% [markdown]
# The last cell prints how long this whole notebook took to execute, from its first cell to its
# last. The outputs shown here come from a full-mode run on a shared two-core CPU machine, often
# under load (the tutorials' index page lists the times of all seven); on another machine, or in
# smoke mode, the time differs.

# %%
elapsed = time.perf_counter() - NOTEBOOK_START
print(f"{'smoke' if SMOKE else 'full'} mode: this notebook ran in {elapsed / 60:.1f} min")
