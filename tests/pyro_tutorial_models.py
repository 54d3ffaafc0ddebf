"""Models written as Pyro's tutorials and documentation write them (shared by several tests).

Each is used unchanged by the kernels, ``run_chains``, SVI, the export and NUTS; together they
cover the three data-plate idioms:

(a) the plate sized from the data, ``obs=y`` (``BayesianRegression``, ``DocsBNN``,
    ``WeightsInsidePlate``);
(b) the plate indexed by its indices, ``obs=y[idx]`` (``varying_intercepts``,
    ``eight_schools``);
(c) the plate subsampling itself, ``subsample_size=`` (``logistic_regression``).
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn


class BayesianRegression(PyroModule):
    """Pyro's "Bayesian regression" tutorial: linear mean, ``sigma ~ Uniform(0, 10)``."""

    def __init__(self, in_features: int, out_features: int = 1) -> None:
        super().__init__()
        self.linear = PyroModule[nn.Linear](in_features, out_features)
        self.linear.weight = PyroSample(
            dist.Normal(0.0, 1.0).expand([out_features, in_features]).to_event(2)
        )
        self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([out_features]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
        return mean


class WeightsInsidePlate(BayesianRegression):
    """The same model with the network evaluated inside the plate: its ``PyroSample`` weights
    are first touched there."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
        with pyro.plate("data", x.shape[0]):
            mean = self.linear(x).squeeze(-1)
            pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
        return mean


class DocsBNN(PyroModule):
    """The Bayesian network of Pyro's documentation (``pyro.nn.PyroModule`` page), classifier."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, prior_scale: float = 1.0) -> None:
        super().__init__()
        self.activation = nn.Tanh()
        self.layer1 = PyroModule[nn.Linear](in_dim, hidden)
        self.layer2 = PyroModule[nn.Linear](hidden, out_dim)
        self.layer1.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([hidden, in_dim]).to_event(2)
        )
        self.layer1.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([hidden]).to_event(1))
        self.layer2.weight = PyroSample(
            dist.Normal(0.0, prior_scale).expand([out_dim, hidden]).to_event(2)
        )
        self.layer2.bias = PyroSample(dist.Normal(0.0, prior_scale).expand([out_dim]).to_event(1))

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.layer2(self.activation(self.layer1(x)))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def logistic_regression(
    x: torch.Tensor, y: torch.Tensor | None = None, subsample_size: int | None = 25
) -> None:
    """Logistic regression with a subsampling plate (Pyro's SVI idiom)."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = pyro.sample("b", dist.Normal(0.0, 1.0))
    with pyro.plate("data", x.shape[0], subsample_size=subsample_size) as idx:
        logits = x[idx] @ w + b
        pyro.sample("obs", dist.Bernoulli(logits=logits), obs=None if y is None else y[idx])


def varying_intercepts(group: torch.Tensor, num_groups: int, y: torch.Tensor | None = None) -> None:
    """Hierarchical varying intercepts (non-centred): ``y_i ~ N(mu + tau a_{g(i)}, sigma)``."""
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = pyro.sample("tau", dist.HalfNormal(2.0))
    sigma = pyro.sample("sigma", dist.HalfNormal(2.0))
    with pyro.plate("groups", num_groups):
        a = pyro.sample("a", dist.Normal(0.0, 1.0))
    with pyro.plate("data", group.shape[0]) as idx:
        mean = mu + tau * a[group[idx]]
        pyro.sample("obs", dist.Normal(mean, sigma), obs=None if y is None else y[idx])


def regression_data(n: int = 200, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    w = torch.linspace(1.0, -1.0, d)
    y = x @ w + 0.3 + 0.5 * torch.randn(n, generator=generator)
    return x, y


def classification_data(
    n: int = 200, d: int = 3, classes: int = 3, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    w = torch.randn(d, classes, generator=generator)
    y = torch.distributions.Categorical(logits=2 * x @ w).sample()
    return x, y


def binary_data(n: int = 200, d: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    logits = x @ torch.linspace(1.5, -1.0, d) - 0.5
    y = (torch.rand(n, generator=generator) < torch.sigmoid(logits)).to(x.dtype)
    return x, y


def grouped_data(
    n: int = 240, num_groups: int = 8, seed: int = 0
) -> tuple[torch.Tensor, int, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    group = torch.arange(n) % num_groups
    intercepts = 1.0 + 0.8 * torch.randn(num_groups, generator=generator)
    y = intercepts[group] + 0.7 * torch.randn(n, generator=generator)
    return group, num_groups, y


#: Rubin's eight schools: the estimated effects and their standard errors.
SCHOOLS_Y = torch.tensor([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = torch.tensor([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools(sigma, y=None):
    """Rubin's eight schools, non-centred (idiom (b)), written as the refusal of a latent
    inside the data plate says: the schools' ``eta`` in a plate of its own, indexed by the data
    plate's rows."""
    mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = pyro.sample("tau", dist.HalfCauchy(5.0))
    with pyro.plate("schools", 8):
        eta = pyro.sample("eta", dist.Normal(0.0, 1.0))
    with pyro.plate("data", 8) as idx:
        pyro.sample("obs", dist.Normal(mu + tau * eta[idx], sigma[idx]), obs=y[idx])


def exact_schools_tau() -> tuple[float, float]:
    """Posterior mean and sd of ``tau`` by quadrature: given tau, ``y`` is Gaussian with
    covariance ``diag(sigma^2 + tau^2) + 25``, mu and eta integrated out."""
    tau = torch.linspace(1e-4, 400.0, 400_001, dtype=torch.float64)
    y, sigma = SCHOOLS_Y.double(), SCHOOLS_SIGMA.double()
    covariance = torch.diag_embed(sigma**2 + tau[:, None] ** 2) + 25.0
    marginal = dist.MultivariateNormal(torch.zeros(8, dtype=torch.float64), covariance)
    log_weight = marginal.log_prob(y) + dist.HalfCauchy(5.0).log_prob(tau)
    weight = (log_weight - log_weight.max()).exp()
    weight = weight / weight.sum()
    mean = float((weight * tau).sum())
    return mean, float((weight * (tau - mean) ** 2).sum().sqrt())
