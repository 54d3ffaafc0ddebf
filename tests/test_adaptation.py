"""The adaptive warm-up (no step size given): it samples known posteriors, it says when it was too
short, a user's step size bypasses it, and ConstantSGD's optimal rate stays stable.

Tolerances: means within 4 Monte Carlo standard errors (ESS-based); covariances within 4 MCSE
plus a relative bias allowance for the adapted step's discretisation and gradient-noise bias,
which the warm-up bounds by design (``NOISE_BOUND`` and ``CURVATURE_BOUND`` in
``pyro_sgmcmc.engine.adaptation``).
"""

from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro_tutorial_models import BayesianRegression
from pyro_tutorial_models import regression_data as tutorial_data
from stats_helpers import (
    ConjugateLinearRegression,
    assert_covariance_close,
    assert_mean_close,
    effective_sample_size,
    regression_data,
)

from pyro_sgmcmc import PSGLD, SGHMC, SGLD, ConstantSGD, run_chains
from pyro_sgmcmc.dynamics.psgld import rmsprop_preconditioner
from pyro_sgmcmc.dynamics.registry import PSGLDOptions
from pyro_sgmcmc.engine.adaptation import (
    MINIMUM_WARMUP_STEPS,
    PSGLD_STEP_QUANTILE,
    SCHEDULE,
    SITE_CAP,
    AdaptiveControl,
)
from pyro_sgmcmc.errors import SamplerDivergedError, SamplerWarning

KERNELS = {"sgld": SGLD, "sghmc": SGHMC, "psgld": PSGLD}
#: SGLD with Euler's step (the default is Leimkuhler and Matthews'), whose bounds differ
SGLD_EULER = functools.partial(SGLD, integrator="euler")


def _correlated_data(n: int, correlation: float, seed: int = 0):
    """Regression inputs whose two columns correlate: a posterior with correlated weights."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 2, generator=generator)
    x = torch.stack([z[:, 0], correlation * z[:, 0] + (1 - correlation**2) ** 0.5 * z[:, 1]], 1)
    y = x @ torch.tensor([1.0, -0.5]) + 0.5 * torch.randn(n, generator=generator)
    return x, y


@pytest.mark.parametrize(
    "name", ["sghmc", "sgld", pytest.param("sgld_euler", marks=pytest.mark.slow),
             pytest.param("psgld", marks=pytest.mark.slow)],
)  # fmt: skip
def test_defaults_sample_the_conjugate_posterior(name):
    """Nothing given but the batch size: the warm-up chooses the step, preconditioner, control
    variate and thinning, and the kept draws are nearly independent (pSGLD's own diagonal
    preconditioner cannot undo the posterior's correlations: it mixes more slowly)."""
    x, y = regression_data(n=1000, d=5)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    kernel_class = SGLD_EULER if name == "sgld_euler" else KERNELS[name]
    result = run_chains(kernel_class(model, batch_size=100, seed=7), x, y, num_chains=4,
                        num_samples=200, warmup_steps=200)  # fmt: skip
    draws = result.samples["w"].double().numpy()
    assert not result.sample_stats["diverging"].any()
    assert_mean_close(draws, mean, z=4.0)
    assert_covariance_close(draws, cov, z=4.0, relative_bias=0.15)
    ess = effective_sample_size(draws.reshape(4, 200, 5))
    assert ess.min() >= (0.1 if name == "psgld" else 0.3) * 800, ess
    assert result.verdict.converged


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_defaults_sample_a_strongly_correlated_posterior(name):
    """Two weights with posterior correlation about -0.95 (Chen et al. 2014's test target)."""
    x, y = _correlated_data(2000, correlation=0.95)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    assert cov[0, 1] / np.sqrt(cov[0, 0] * cov[1, 1]) < -0.9
    result = run_chains(KERNELS[name](model, batch_size=100, seed=3), x, y, num_chains=4,
                        num_samples=500, warmup_steps=200)  # fmt: skip
    draws = result.samples["w"].double().numpy()
    assert_mean_close(draws, mean, z=4.0)
    assert_covariance_close(draws, cov, z=4.0, relative_bias=0.15)


def _common_factor_data(n: int, d: int, loading: float, seed: int = 0):
    """Inputs that share one factor: the posterior precision has one eigenvalue about
    ``1 + (d - 1) * loading`` times the diagonal, along the inputs' mean."""
    generator = torch.Generator().manual_seed(seed)
    factor = torch.randn(n, 1, generator=generator)
    x = loading**0.5 * factor + (1 - loading) ** 0.5 * torch.randn(n, d, generator=generator)
    y = x @ torch.randn(d, generator=generator) + 0.5 * torch.randn(n, generator=generator)
    return x, y


@pytest.mark.parametrize("name", ["sgld_euler", "sghmc", "sgld"])
def test_the_stiffest_direction_of_a_coupled_posterior_keeps_its_variance(name):
    """200 coupled weights, full-batch gradients: the stiffest direction of the posterior is
    about 14 times stiffer than the diagonal bound sees. Without the power-iteration bound
    (``STABILITY_BOUND``) the variance along it came out 1.8 times the exact one; with it,
    1.12 (SGLD with Euler's step), 0.99 (SGHMC) and 1.01 (SGLD's default, Leimkuhler and
    Matthews' step, whose bounds allow larger steps; MCSE 0.04-0.05)."""
    x, y = _common_factor_data(5000, 200, loading=0.3)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    eigenvalues, eigenvectors = np.linalg.eigh(np.linalg.inv(cov))
    thinning = 4 if name == "sghmc" else 1  # SGHMC's low default friction mixes slowly
    kernel_class = SGLD_EULER if name == "sgld_euler" else KERNELS[name]
    kernel = kernel_class(model, num_steps_per_sample=thinning, seed=3)
    result = run_chains(kernel, x, y, num_chains=2, num_samples=2000,
                        warmup_steps=1000 // thinning)  # fmt: skip
    draws = result.samples["w"].double().numpy()
    # whitened coordinate along the stiffest direction: variance 1 under the exact posterior
    stiffest = (draws - mean) @ eigenvectors[:, -1] * np.sqrt(eigenvalues[-1])
    centred = stiffest - stiffest.mean()
    variance = float(centred.var())
    mcse = variance * np.sqrt(2.0 / float(effective_sample_size(centred[..., None] ** 2)[0]))
    print(f"variance along the stiffest direction {variance:.3f} (MCSE {mcse:.3f})")
    assert abs(variance - 1.0) <= 4 * mcse + 0.3, (variance, mcse)


def test_the_adapted_step_is_frozen_for_sampling_and_a_given_step_is_kept():
    x, y = regression_data(n=400, d=3)
    model = ConjugateLinearRegression()
    adapted = run_chains(SGLD(model, batch_size=50, num_steps_per_sample=1, seed=0), x, y,
                         num_chains=2, num_samples=50, warmup_steps=200)  # fmt: skip
    steps = adapted.sample_stats["step_size"]
    assert np.all(steps == steps[:, :1]), "the step moved during sampling"
    assert np.all(steps > 0)
    given = run_chains(SGLD(model, step_size=1e-5, batch_size=50, num_steps_per_sample=1, seed=0),
                       x, y, num_chains=2, num_samples=50, warmup_steps=10)  # fmt: skip
    assert np.allclose(given.sample_stats["step_size"], 1e-5)


@pytest.mark.filterwarnings("ignore:.*not converged")  # a short run: only the statistics count
@pytest.mark.parametrize("kernel", [SGLD, PSGLD])
def test_each_draws_step_size_is_the_median_step_its_coordinates_take(kernel):
    """What the progress bar, ``diagnostics()`` and ``sample_stats`` call the step size is the
    median over the coordinates of :math:`h P_i`, not the step :math:`h` per unit of
    preconditioner (the adaptive :math:`h` is about 0.1 where the coordinates move by 1e-4)."""
    x, y = regression_data(n=400, d=3)
    model = ConjugateLinearRegression()
    result = run_chains(kernel(model, batch_size=50, seed=0), x, y, num_chains=2,
                        num_samples=20, warmup_steps=100)  # fmt: skip
    for c, report in enumerate(result.chain_reports):
        median = report["coordinate_step"]["w"]["median"]  # the model's one site
        np.testing.assert_allclose(result.sample_stats["step_size"][c], median, rtol=1e-12)
    shown = []  # the progress bar's fields after each draw

    def read_the_bar(kernel, params, stage, i):
        shown.append(kernel.logging()["step size"])

    mcmc = MCMC(kernel(model, batch_size=50, seed=0), num_samples=20, warmup_steps=100,
                disable_progbar=True, hook_fn=read_the_bar)  # fmt: skip
    mcmc.run(x, y)
    diagnostics = mcmc.diagnostics()
    median = diagnostics["coordinate_step"]["chain 0"]["w"]["median"]
    np.testing.assert_allclose(diagnostics["step_size"]["chain 0"].numpy(), median, rtol=1e-12)
    assert shown[-1] == f"{median:.2e}"


@pytest.mark.filterwarnings("ignore:.*not converged")  # a short run: only the report counts
@pytest.mark.parametrize(
    ("kernel", "dimension", "options", "kind"),
    [
        (PSGLD, 3, {}, "dense"),  # the warm-up's dense metric replaces pSGLD's RMSprop
        (PSGLD, 120, {}, "rmsprop"),  # above 100 coordinates: no dense metric
        (SGHMC, 120, {}, "diagonal"),
        (PSGLD, 3, {"step_size": 1e-4}, "rmsprop"),
        (SGLD, 3, {"step_size": 1e-4}, "identity"),
    ],
)
def test_the_run_names_the_preconditioner_it_used(kernel, dimension, options, kind):
    x, y = regression_data(n=400, d=dimension)
    sampler = kernel(ConjugateLinearRegression(), batch_size=50, seed=0, **options)
    mcmc = MCMC(sampler, num_samples=10, warmup_steps=50, disable_progbar=True)
    mcmc.run(x, y)
    assert mcmc.diagnostics()["preconditioner"]["chain 0"] == kind
    shown = repr(sampler)  # after the run: what its (last) chain used
    assert f"{kind} preconditioner" in shown, shown
    assert "median coordinate step" in shown
    if not options:
        thinning = mcmc.diagnostics()["num_steps_per_sample"]["chain 0"]
        assert f"num_steps_per_sample=auto (chose {thinning})" in shown, shown


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")  # 10 draws: only the descent
def test_the_descent_ends_at_the_average_of_its_last_fifth(monkeypatch):
    """Every chain leaves the descent at the average of its positions over the descent's last
    fifth (40-50% of the warm-up), not at its last iterate."""
    seen, ended = [], []
    average_descent = AdaptiveControl._average_descent

    def spy(control, engine):
        seen.append(engine.position.clone())
        average_descent(control, engine)
        if engine.t == control.descent_end:
            ended.append(engine.position.clone())

    monkeypatch.setattr(AdaptiveControl, "_average_descent", spy)
    x, y = regression_data(n=400, d=3)
    warmup = 200
    run_chains(SGHMC(ConjugateLinearRegression(), batch_size=50, num_steps_per_sample=1, seed=0),
               x, y, num_chains=2, num_samples=10, warmup_steps=warmup)  # fmt: skip
    start, end = int(SCHEDULE["average"] * warmup), int(SCHEDULE["descent"] * warmup)
    assert len(seen) == end - start and len(ended) == 1
    torch.testing.assert_close(ended[0], torch.stack(seen).mean(0))
    assert not torch.allclose(ended[0], seen[-1]), "the descent ended at its last iterate"


def test_a_warmup_below_the_minimum_is_refused_by_name():
    """With a thinning given, the warm-up is warm-up draws x thinning gradient steps (a kernel
    that chooses its thinning makes its warm-up long enough itself)."""
    x, y = regression_data(n=200, d=3)
    kernel = SGLD(ConjugateLinearRegression(), batch_size=50, num_steps_per_sample=1, seed=0)
    with pytest.raises(ValueError, match=f"needs at least {MINIMUM_WARMUP_STEPS} warm-up"):
        MCMC(kernel, num_samples=5, warmup_steps=MINIMUM_WARMUP_STEPS - 1,
             disable_progbar=True).run(x, y)  # fmt: skip


def test_a_warmup_too_short_to_arrive_warns_and_names_the_site():
    """Pyro's tutorial regression from its default start: 50 warm-up steps leave the noise
    scale many posterior standard deviations from its value; 500 are enough, and silent."""
    x, y = tutorial_data()
    short = MCMC(SGLD(BayesianRegression(3), batch_size=25, num_steps_per_sample=1, seed=3),
                 num_samples=20, warmup_steps=50, disable_progbar=True)  # fmt: skip
    with pytest.warns(SamplerWarning, match=r"still on its way .* site 'sigma' sat \d+ posterior"):
        short.run(x, y)
    long = MCMC(SGLD(BayesianRegression(3), batch_size=25, num_steps_per_sample=1, seed=3),
                num_samples=20, warmup_steps=500, disable_progbar=True)  # fmt: skip
    with warningsless():
        # 20 draws cannot reach the verdict's ESS: only that warning is allowed here
        warnings.filterwarnings("ignore", message="MCMC with SGLD: .* not converged")
        long.run(x, y)
    assert abs(float(long.get_samples()["sigma"].mean()) - 0.5) < 0.1


@contextmanager
def warningsless():
    """Turn any SamplerWarning into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplerWarning)
        yield


@pytest.mark.parametrize(("radius", "warmup"), [(2.0, 60), (20.0, 200)])
def test_the_descent_starts_far_away_without_blowing_up(radius, warmup):
    """Starts far out in the tails (weights of size ``radius``, 100 and 1000 posterior standard
    deviations out): the ramped descent reaches the posterior with no divergence and no
    warning (a descent moves at most a few hundredths per step: the farther start needs the
    longer warm-up, and the shorter one says so -- see the test above). With the thinning
    chosen by the kernel, a warm-up draw is ``ceil(4000 / warmup)`` gradient steps."""
    x, y = regression_data(n=1000, d=5)
    model = ConjugateLinearRegression()
    mean, _ = model.posterior(x, y)
    start = {"w": torch.full((2, 5), radius)}
    with warningsless():
        result = run_chains(SGHMC(model, batch_size=100, seed=1), x, y, num_chains=2,
                            num_samples=400, warmup_steps=warmup, initial_params=start)  # fmt: skip
    assert result.divergent_steps == ((), ())
    draws = result.samples["w"].double().numpy()
    assert_mean_close(draws, mean, z=4.0)


@pytest.mark.parametrize("preconditioner", ["scalar", "diagonal"])
def test_constant_sgd_optimal_rate_is_clipped_to_a_stable_rate(preconditioner):
    """The tutorial regression's noise scale is stiff and has little gradient noise: Mandt et
    al.'s rate alone is unstable there; clipped to half of SGD's stability limit it samples."""
    x, y = tutorial_data()
    kernel = ConstantSGD(BayesianRegression(3), batch_size=25, seed=3, num_steps_per_sample=1,
                         preconditioner=preconditioner)  # fmt: skip
    mcmc = MCMC(kernel, num_samples=300, warmup_steps=400, disable_progbar=True)
    mcmc.run(x, y)
    draws = mcmc.get_samples()
    assert not mcmc.diagnostics()["divergences"]["chain 0"]
    assert abs(float(draws["sigma"].mean()) - 0.53) < 0.05
    assert float(draws["linear.weight"].std(0).max()) < 0.2


# step sizes that sample the conjugate regression (N = 1000) well within a few hundred steps;
# 10x to 1000x too large below
GOOD_STEPS = {"sgld": 4e-6, "sghmc": 4e-7, "psgld": 3e-5}


@pytest.mark.parametrize("driver", ["mcmc", "run_chains"])
@pytest.mark.parametrize("factor", [10, 100, 1000])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_a_step_too_large_by_hand_is_never_silent_garbage(name, factor, driver):
    """Either the draws are still near the posterior (within 10 posterior sds), or the run says
    so: a ``SamplerDivergedError``, recorded divergences, or a ``SamplerWarning``."""
    x, y = regression_data(n=1000, d=5)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    kernel = KERNELS[name](model, step_size=factor * GOOD_STEPS[name], batch_size=100, seed=2,
                           num_steps_per_sample=1)  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if driver == "mcmc":
                mcmc = MCMC(kernel, num_samples=100, warmup_steps=300, disable_progbar=True)
                mcmc.run(x, y)
                draws = mcmc.get_samples()["w"]
                diverged = bool(mcmc.diagnostics()["divergences"]["chain 0"])
            else:
                result = run_chains(kernel, x, y, num_chains=2, num_samples=100,
                                    warmup_steps=300)  # fmt: skip
                draws = result.samples["w"].reshape(-1, 5)
                diverged = bool(result.sample_stats["diverging"].any())
        except SamplerDivergedError:
            return
    warned = any(issubclass(w.category, SamplerWarning) for w in caught)
    if diverged or warned:
        return
    error = (draws.double().mean(0).numpy() - mean) / np.sqrt(np.diag(cov))
    assert np.abs(error).max() < 10, f"silent garbage: {error} posterior sds off"


@pytest.mark.slow
def test_psgld_defaults_sample_a_conjugate_posterior_with_a_diagonal_capped_preconditioner():
    """Above DENSE_LIMIT coordinates pSGLD keeps its RMSprop diagonal, capped per coordinate by
    the warm-up (the cap is constant once it ends): the draws have the exact posterior's means
    and variances within Monte Carlo error (plus the warm-up's bounded step bias)."""
    x, y = regression_data(n=2000, d=120)
    model = ConjugateLinearRegression()
    mean, cov = model.posterior(x, y)
    result = run_chains(PSGLD(model, batch_size=100, seed=3), x, y, num_chains=4,
                        num_samples=200, warmup_steps=400)  # fmt: skip
    draws = result.samples["w"].double().numpy()
    assert not result.sample_stats["diverging"].any()
    assert_mean_close(draws, mean, z=4.0)
    variances = np.diag(cov)
    flat = draws.reshape(-1, draws.shape[-1])
    ess = effective_sample_size((draws - draws.mean((0, 1))) ** 2)
    error = np.abs(flat.var(0) - variances)
    # the standard error of a Gaussian variance is sqrt(2) var / sqrt(ESS)
    assert np.all(error <= 4.0 * np.sqrt(2.0 / ess) * variances + 0.15 * variances)


@pytest.mark.filterwarnings("ignore:run_chains.*not converged")
def test_psgld_step_is_not_set_by_one_coordinate_and_none_steps_beyond_its_bound(monkeypatch):
    """pSGLD's adapted h is the 90th percentile over the coordinates of bound / RMSprop gain,
    and each gain is capped so that h * gain stays within the coordinate's bound. The weights of
    inputs that are zero on every row (as a ReLU unit inactive on every row sees them) have only
    their prior's gradient, so RMSprop gives them a gain near 1 / epsilon: the smallest ratio,
    which set h for all before."""
    seen = []
    psgld_step = AdaptiveControl._psgld_step

    def spy(control, engine, allowed):
        step = psgld_step(control, engine, allowed)
        gain = rmsprop_preconditioner(engine.state.square_average["z"], control.options.epsilon)
        seen.append((allowed, gain, step, control.gain_cap))
        return step

    monkeypatch.setattr(AdaptiveControl, "_psgld_step", spy)
    x, y = regression_data(n=400, d=100)  # above DENSE_LIMIT coordinates: a diagonal metric
    x = torch.cat([x, torch.zeros(len(x), 4)], 1)
    run_chains(PSGLD(ConjugateLinearRegression(), batch_size=50, num_steps_per_sample=1, seed=0),
               x, y, num_chains=2, num_samples=10, warmup_steps=200)  # fmt: skip
    assert seen, "the warm-up never chose pSGLD's step"
    for allowed, gain, step, cap in seen:
        ratio = allowed / gain
        assert torch.all(step * torch.minimum(gain, cap) <= allowed * (1 + 1e-6))
        rank = math.ceil(PSGLD_STEP_QUANTILE * ratio.shape[1])
        torch.testing.assert_close(step, ratio.kthvalue(rank, dim=1, keepdim=True).values)
        # the dead inputs' weights have the smallest ratio, far below the others'
        dead = ratio[:, -4:].amax(1, keepdim=True)
        assert torch.all(ratio[:, :-4].amin(1, keepdim=True) > 10 * dead)
        assert torch.all(step > 100 * dead)


def test_a_psgld_coordinate_that_ran_away_gets_a_tenth_of_its_gain():
    """As SGLD's and SGHMC's preconditioner, pSGLD's gain is divided by ten in a coordinate that
    ran away (through its cap), and only there."""
    like = torch.zeros(2, 3)
    control = AdaptiveControl("psgld", PSGLDOptions(), 1.0, 100, 400, like, dense=False)
    square = torch.tensor([[1e-4, 1e-2, 1.0], [1e-4, 1e-2, 1.0]])
    control.gain_cap = torch.full((2, 3), 50.0)
    runaway = torch.tensor([[False, True, False], [True, False, False]])
    engine = SimpleNamespace(state=SimpleNamespace(square_average={"z": square}),
                             monitor=SimpleNamespace(runaway=runaway))  # fmt: skip
    before = control.unit_step(engine)  # min(1 / (1e-5 + sqrt V), 50): 50, ~10, ~1
    assert control._shrink_runaway(engine).tolist() == [True, True]
    after = control.unit_step(engine)
    torch.testing.assert_close(after, torch.where(runaway, 0.1 * before, before))


def test_the_site_cap_is_the_median_of_the_coordinates_the_data_reach():
    """A site whose coordinates are mostly out of the data's reach (the weights of ReLU units
    off on every row: no gradient noise, only the prior's curvature) steps at most
    ``SITE_CAP`` times the median of its reached coordinates -- with the median over all of
    them, a dead coordinate's, those steps were thousands of times the live ones' on LeNet-5;
    a site the data do not reach at all keeps the median of all its coordinates."""
    live = torch.tensor([1e-4, 2e-4, 3e-4])
    # chain 0: site "w" with 7 of 10 coordinates unreached; site "s" (2) unreached entirely
    allowed = torch.cat([live, torch.full((7,), 0.05), torch.tensor([1.0, 3.0])])
    noise = torch.cat([torch.ones(3), torch.zeros(7), torch.zeros(2)])
    # chain 1: every coordinate of "w" reached, one of them far above the rest
    allowed_1 = torch.cat([torch.full((9,), 1e-3), torch.tensor([1.0, 1.0, 3.0])])
    engine = SimpleNamespace(layout=SimpleNamespace(sizes=[10, 2]))
    capped = AdaptiveControl._site_cap(
        engine, torch.stack([allowed, allowed_1]), torch.stack([noise, torch.ones(12)])
    )
    cap = SITE_CAP * 2e-4
    assert capped[0, :3].tolist() == live.tolist()  # the reached steps are below the cap
    torch.testing.assert_close(capped[0, 3:10], torch.full((7,), cap))
    torch.testing.assert_close(capped[0, 10:], torch.tensor([1.0, 3.0]))  # median 1, cap 4
    torch.testing.assert_close(
        capped[1, :10], torch.cat([torch.full((9,), 1e-3), torch.tensor([SITE_CAP * 1e-3])])
    )
    torch.testing.assert_close(capped[1, 10:], torch.tensor([1.0, 3.0]))


def _normal_mean(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as rows:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[rows])


@pytest.mark.parametrize(
    ("integrator", "friction", "bound"),
    [("euler", 1.0, 0.05), ("euler", 0.2, 0.09), ("baoab", 1.0, 0.1), ("baoab", 0.2, 0.1)],
)
def test_sghmc_steps_within_the_curvature_bound_of_its_integrator(integrator, friction, bound):
    """Euler's SGHMC inflates a Gaussian's variance by eH / (2(2 - alpha)): its c_H = 0.1 is
    scaled by 1 - alpha/2 (at friction 1, Euler's SGLD with its bound 0.05); BAOAB's variance
    is exact, and keeps c_H. A Normal mean on all 100 rows: the curvature is 100 + 1/100."""
    y = torch.randn(100, generator=torch.Generator().manual_seed(0))
    kernel = SGHMC(_normal_mean, friction=friction, integrator=integrator, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)
        result = run_chains(kernel, y, num_chains=2, num_samples=20, target_ess=None)
    for report in result.chain_reports:
        step = report["coordinate_step"]["mu"]["median"]
        assert step * (100 + 1e-2) == pytest.approx(bound, rel=1e-3)
