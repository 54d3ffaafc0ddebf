"""Models, data and checkpoints that used to run silently wrong or fail with another library's
words (issue 27's probe): each is now refused, or run, with a message that names the site, the
argument or the shapes (docs/bad-input.md, "Models and data the kernels refuse by name")."""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import MCMC
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyro_sgmcmc import (
    SGHMC,
    SGLD,
    CheckpointError,
    ModelContractError,
    ResumableMCMC,
    SamplerDivergedError,
    load_checkpoint,
    run_chains,
    to_inference_data,
)
from pyro_sgmcmc.data.datasets import load_table
from pyro_sgmcmc.inference.checkpoint_files import save_checkpoint
from pyro_sgmcmc.variational.svi import fit_svi

pytestmark = pytest.mark.filterwarnings("ignore::pyro_sgmcmc.errors.SamplerWarning")

GEN = torch.Generator().manual_seed(0)
N = 60
X = torch.randn(N, 2, generator=GEN)
Y = X @ torch.tensor([1.0, -2.0]) + 3.0 + 0.3 * torch.randn(N, generator=GEN)


def regression(x, y):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)


def mean_model(y):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)


def run(kernel, *data, warmup_steps=2, num_samples=3):
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=True)
    mcmc.run(*data)
    return mcmc


def sgld(model, **options):
    return SGLD(model, **{"step_size": 1e-3, "batch_size": 10, "seed": 0, **options})


# ---------------------------------------------------------------------- model contract
@pytest.mark.parametrize("y", [Y.unsqueeze(-1), Y.unsqueeze(0).expand(2, N)], ids=["N1", "2N"])
def test_observations_that_broadcast_the_likelihood_are_refused_naming_the_shapes(y):
    shape = tuple(y.shape)
    message = (
        rf"observed site 'obs': the observations have shape \({shape[0]}, {shape[1]}\) but "
        rf"the distribution \(Normal\) has batch shape \({N},\)"
    )
    with pytest.raises(ModelContractError, match=message):
        run(sgld(regression), X, y)
    with pytest.raises(ModelContractError, match=message):
        run_chains(sgld(regression), X, y, num_chains=1, num_samples=2)


def test_a_subsample_size_larger_than_the_plate_is_refused_by_name():
    def model(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", y.shape[0], subsample_size=1000) as idx:
            pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])

    with pytest.raises(
        ModelContractError,
        match=rf"pyro.plate\('data', {N}, subsample_size=1000\): subsample_size must be at "
        rf"most the plate's size {N}",
    ):
        run(sgld(model), Y)


def data_prior(y):
    """Idiom (a) with a prior built from the data outside the plate: sliced to a minibatch,
    ``y.sum()`` changes on every step (the prior's mean from 60 rows becomes that of 10)."""
    mu = pyro.sample("mu", dist.Normal(y.sum() / N, 1.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y)


def data_prior_indexed(y):
    """The same model with an indexed plate: the arguments stay whole, the prior fixed."""
    mu = pyro.sample("mu", dist.Normal(y.sum() / N, 1.0))
    with pyro.plate("data", N) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def test_a_prior_computed_from_sliced_data_is_refused_naming_the_site():
    with pytest.raises(
        ModelContractError,
        match=r"the prior of latent site 'mu' depends on the data arguments \(args\[0\]\), "
        r"which are sliced to each minibatch",
    ):
        run(sgld(data_prior), Y)
    samples = run(sgld(data_prior_indexed), Y).get_samples()
    assert torch.isfinite(samples["mu"]).all()


def obs_mask_model(y, mask):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx:
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx], obs_mask=mask[idx])


def poutine_mask_model(y, mask):
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]) as idx, pyro.poutine.mask(mask=mask[idx]):
        pyro.sample("obs", dist.Normal(mu, 1.0), obs=y[idx])


def test_obs_mask_is_refused_with_the_mask_that_works():
    """obs_mask creates a latent per missing row ('obs_unobserved'), which the user never
    wrote: the refusal names it and gives poutine.mask, which works."""
    mask = torch.arange(Y.shape[0]) % 4 != 0
    with pytest.raises(
        ModelContractError,
        match=r"latent site 'obs_unobserved' is the one Pyro creates for the rows that obs_mask "
        r"marks missing in 'obs'.*poutine.mask\(mask=mask\[idx\]\)",
    ):
        run(sgld(obs_mask_model), Y, mask)
    samples = run(sgld(poutine_mask_model), Y, mask).get_samples()
    assert torch.isfinite(samples["mu"]).all()


def test_data_on_the_meta_device_are_refused_by_name():
    with pytest.raises(ValueError, match=r"model argument args\[0\] is on the 'meta' device"):
        run(sgld(mean_model), Y.to("meta"))


class _TutorialRegression(PyroModule):
    """Pyro's tutorial regression: ``PyroModule[nn.Linear]`` with ``PyroSample`` weights."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = PyroModule[nn.Linear](2, 1)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
        self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(self.linear(x).squeeze(-1), 1.0), obs=y)


@pytest.mark.parametrize("model", [regression, _TutorialRegression()], ids=["function", "module"])
def test_float64_data_for_a_float32_model_are_named_whatever_the_model(model):
    """A function model met the dtype check; a module failed first, inside its ``nn.Linear``,
    with torch's 'mat1 and mat2 must have the same dtype' behind a generic message."""
    with pytest.raises(ModelContractError, match=r"given to run\(...\): model argument args\[0\] "
                       r"has dtype torch\.float64, but the model computes in torch\.float32: "
                       r"convert the data"):  # fmt: skip
        run(sgld(model), X.double(), Y.double())


def test_initial_params_for_some_sites_start_the_others_from_the_init_strategy():
    def two_sites(y):
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        scale = pyro.sample("scale", dist.HalfNormal(2.0))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("obs", dist.Normal(mu, scale), obs=y)

    kernel = sgld(two_sites)
    kernel.initial_params = {"mu": torch.tensor(2.5)}
    kernel.setup(0, Y)
    start = kernel.initial_params
    assert float(start["mu"]) == 2.5
    assert start["scale"].shape == () and torch.isfinite(start["scale"])


# ---------------------------------------------------------------------- hand-given steps
@pytest.mark.parametrize(
    "kernel",
    [
        lambda m: SGLD(m, step_size=1e3, batch_size=20, seed=0),
        lambda m: SGHMC(m, step_size=0.05, batch_size=20, seed=0),
    ],
    ids=["sgld-1e3", "sghmc-0.05"],
)
def test_a_hand_step_far_too_large_raises_naming_the_step_and_the_sites(kernel):
    """Once these froze far from the posterior without a word; now every step diverges and the
    run stops, naming the sites (or the blow-up) and the step size."""

    def model(y):
        scale = pyro.sample("scale", dist.HalfNormal(10.0))
        mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
        with pyro.plate("data", y.shape[0]):
            pyro.sample("obs", dist.Normal(mu, scale), obs=y)

    y = 3.0 + 0.5 * torch.randn(400, generator=torch.Generator().manual_seed(1))
    with pytest.raises(
        SamplerDivergedError,
        match=r"divergent steps in a row .*\(last: (non-finite values at sites \[.*\]|a blow-up "
        r"of the potential)\)\. Give a smaller step_size",
    ):
        run(kernel(model), y, warmup_steps=100, num_samples=100)


# ---------------------------------------------------------------------- checkpoints
def other_likelihood(y):
    """``mean_model``'s sites with a Student-t likelihood: the same names and shapes."""
    mu = pyro.sample("mu", dist.Normal(0.0, 10.0))
    with pyro.plate("data", y.shape[0]):
        pyro.sample("obs", dist.StudentT(3.0, mu, 1.0), obs=y)


def test_resuming_with_another_model_of_the_same_sites_is_refused(tmp_path):
    path, chains = tmp_path / "resumable.ckpt", tmp_path / "chains.ckpt"
    ResumableMCMC(
        sgld(mean_model), 3, warmup_steps=2, num_chains=2, disable_progbar=True,
        checkpoint_path=path,
    ).run(Y)  # fmt: skip
    run_chains(sgld(mean_model), Y, num_chains=2, num_samples=3, checkpoint_path=chains)
    message = r"belongs to another kernel or model .*model_log_density: saved -?\d"
    with pytest.raises(CheckpointError, match=message):
        ResumableMCMC.resume(path, sgld(other_likelihood), Y, disable_progbar=True)
    with pytest.raises(CheckpointError, match=message):
        run_chains(sgld(other_likelihood), Y, num_chains=2, num_samples=3, resume_from=chains)
    # the model the checkpoints were written with continues them
    ResumableMCMC.resume(path, sgld(mean_model), Y, disable_progbar=True)
    run_chains(sgld(mean_model), Y, num_chains=2, num_samples=3, resume_from=chains)


def test_a_checkpoint_written_before_the_model_density_was_recorded_still_resumes(tmp_path):
    path = tmp_path / "old.ckpt"
    ResumableMCMC(
        sgld(mean_model), 3, warmup_steps=2, num_chains=2, disable_progbar=True,
        checkpoint_path=path,
    ).run(Y)  # fmt: skip
    payload = load_checkpoint(path)
    for signature in [payload["signature"]] + [
        chain["kernel_state"]["signature"] for chain in payload["chains"]
    ]:
        signature.pop("model_log_density", None)  # one dict may be listed twice
    save_checkpoint(payload, path)
    resumed = ResumableMCMC.resume(path, sgld(mean_model), Y, disable_progbar=True)
    assert resumed.get_samples()["mu"].shape == (6,)


# ---------------------------------------------------------------------- export, tables
def test_an_unknown_plate_name_in_the_export_is_named(tmp_path):
    mcmc = run(sgld(mean_model), Y)
    with pytest.raises(
        ModelContractError,
        match=r"plate_name='rows': the model has no pyro.plate named 'rows'; plates found: "
        r"\['data'\]",
    ):
        to_inference_data(mcmc, mean_model, Y, plate_name="rows")
    # fit_svi names its own argument (it once suggested the kernels' subsample_plate=, which it
    # refuses)
    with pytest.raises(
        ModelContractError,
        match=r"plate_name='rows': .*plates found: \['data'\]; pass plate_name= one of them",
    ):
        fit_svi(mean_model, Y, num_steps=2, plate_name="rows")


class LogisticRegression(PyroModule):
    """A classifier as Pyro's examples write one, ending in its ``Bernoulli`` observations."""

    def __init__(self):
        super().__init__()
        self.linear = PyroModule[nn.Linear](2, 1)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 2]).to_event(2))
        self.linear.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))

    def forward(self, x, y=None):
        logits = self.linear(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Bernoulli(logits=logits), obs=y)


@pytest.mark.parametrize("how", ["MCMC", "run_chains"])
def test_integer_labels_of_a_bernoulli_are_named_not_blamed_on_the_plate(how):
    """Was: "the model cannot be restricted to a minibatch of the plate 'data' ... Check that
    every data tensor has the plate's rows first" (Pyro's NUTS says torch's "result type Float
    can't be cast to the desired output type Long")."""
    labels = (X[:, 0] > 0).long()
    kernel = SGHMC(LogisticRegression(), batch_size=10, seed=0)
    message = (
        r"the log-likelihood of observed site 'obs' \(Bernoulli\) cannot be computed on the "
        r"data given, observations of dtype torch\.int64 \(RuntimeError: .*\)\. Bernoulli "
        r"scores its observations in floating point: pass them as floats \(e\.g\. y\.float"
    )
    with pytest.raises(ModelContractError, match=message):
        if how == "MCMC":
            run(kernel, X, labels)
        else:
            run_chains(kernel, X, labels, num_chains=2, num_samples=3, warmup_steps=2)
    run(SGHMC(LogisticRegression(), batch_size=10, seed=0), X, labels.float())  # what works


def test_fit_svi_refuses_data_the_model_fails_on_in_one_line():
    """As the kernels do (float64 data for a float32 network): the argument and both dtypes
    named, not torch's error with Pyro's table of trace shapes."""

    class Regression(PyroModule):
        def __init__(self):
            super().__init__()
            self.linear = PyroModule[nn.Linear](3, 1)
            self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 3]).to_event(2))

        def forward(self, x, y=None):
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Normal(self.linear(x).squeeze(-1), 1.0), obs=y)

    model = Regression()
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    with pytest.raises(
        ModelContractError,
        match=r"the model fails on the data given to fit_svi\(...\): model argument args\[0\] "
        r"has dtype torch\.float64, but the model computes in torch\.float32",
    ) as refused:
        fit_svi(model, x, y, num_steps=2)
    assert "Trace Shapes" not in str(refused.value)


def test_a_class_column_of_single_rows_is_named(tmp_path):
    path = tmp_path / "ids.csv"
    rows = [f"{float(a):.4f},{float(b):.4f},id{i}" for i, (a, b) in enumerate(X.tolist())]
    path.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(
        ValueError,
        match=rf"{N} of the {N} classes have a single row \(e.g. 'id0', .*is the target column "
        "an identifier rather than a class",
    ):
        load_table(path, "label")


def test_a_split_that_holds_out_far_more_than_asked_says_why(tmp_path):
    """A numeric target read as classes: every class of two rows keeps one test row, half the
    data instead of a fifth."""
    path = tmp_path / "scores.csv"
    values = np.repeat(np.arange(30), 2)  # 30 classes of two rows each
    rows = [f"{i / 10:.2f},{value}" for i, value in enumerate(values)]
    path.write_text("a,score\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match=r"holds out 50% of the rows, not the test_fraction 20%: "
                      r"30 of the 30 classes have too few rows"):  # fmt: skip
        load_table(path, "score", task="classification")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a regression, or classes large enough: no warning
        load_table(path, "score", task="regression")
        balanced = tmp_path / "balanced.csv"
        labels = np.arange(60) % 3
        balanced.write_text("a,label\n" + "\n".join(f"{i},{c}" for i, c in enumerate(labels)))
        load_table(balanced, "label", task="classification")


def test_a_constant_regression_target_is_refused_by_name(tmp_path):
    path = tmp_path / "flat.csv"
    path.write_text("a,price\n" + "\n".join(f"{i},3.5" for i in range(10)) + "\n")
    with pytest.raises(ValueError, match=r"target column 'price' holds one value \('3.5'\)"):
        load_table(path, "price")
