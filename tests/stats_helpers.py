"""Monte Carlo error helpers and models with exact posteriors, shared by the statistical tests."""

from __future__ import annotations

from collections.abc import Mapping

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import torch


def effective_sample_size(draws: np.ndarray) -> np.ndarray:
    """Bulk ESS per coordinate of draws shaped ``(chain, draw, *coordinates)``."""
    draws = np.asarray(draws, dtype=float)
    flat = draws.reshape(draws.shape[0], draws.shape[1], -1)
    return np.array([az.ess(flat[:, :, i]) for i in range(flat.shape[-1])])


def assert_mean_close(draws: np.ndarray, mean: np.ndarray, *, z: float = 4.0, bias: float = 0.0):
    """|sample mean - mean| <= z * MCSE + bias, coordinate-wise, with MCSE = sd / sqrt(ESS)."""
    draws = np.asarray(draws, dtype=float)
    flat = draws.reshape(draws.shape[0] * draws.shape[1], -1)
    ess = effective_sample_size(draws)
    mcse = flat.std(axis=0) / np.sqrt(ess)
    error = np.abs(flat.mean(axis=0) - np.asarray(mean).reshape(-1))
    assert np.all(error <= z * mcse + bias), (
        f"mean error {error} exceeds {z} x MCSE {mcse} + bias {bias} (ESS {ess})"
    )


def assert_covariance_close(
    draws: np.ndarray, covariance: np.ndarray, *, z: float = 4.0, relative_bias: float = 0.0
):
    r"""Each entry of the sample covariance within z standard errors of the target.

    For Gaussian draws the standard error of :math:`\hat\Sigma_{ij}` is
    :math:`\sqrt{(\Sigma_{ij}^2 + \Sigma_{ii}\Sigma_{jj}) / n_\mathrm{eff}}`; ``n_eff`` is the
    smallest ESS of the centred products.
    """
    draws = np.asarray(draws, dtype=float)
    chains, n = draws.shape[:2]
    flat = draws.reshape(chains, n, -1)
    d = flat.shape[-1]
    centred = flat - flat.reshape(-1, d).mean(axis=0)
    sample_cov = np.cov(flat.reshape(-1, d), rowvar=False).reshape(d, d)
    diag = np.diag(covariance)
    for i in range(d):
        for j in range(i, d):
            products = centred[:, :, i] * centred[:, :, j]
            ess = float(az.ess(products))
            se = np.sqrt((covariance[i, j] ** 2 + diag[i] * diag[j]) / ess)
            allowed = z * se + relative_bias * np.sqrt(diag[i] * diag[j])
            assert abs(sample_cov[i, j] - covariance[i, j]) <= allowed, (
                f"cov[{i},{j}] = {sample_cov[i, j]:.4g} vs exact {covariance[i, j]:.4g}: "
                f"allowed {allowed:.3g} (ESS {ess:.0f})"
            )


class ConjugateLinearRegression:
    r"""Bayesian linear regression with a known noise scale and a Gaussian prior.

    ``w ~ N(0, prior_scale^2 I)``, ``y_i ~ N(x_i^T w, noise_scale^2)``. The posterior is
    Gaussian with precision :math:`A = X^T X / \sigma^2 + I / \tau^2` and mean
    :math:`A^{-1} X^T y / \sigma^2`. Implements the fast-path ``log_joint`` too.
    """

    def __init__(self, noise_scale: float = 0.5, prior_scale: float = 1.0) -> None:
        self.noise_scale = noise_scale
        self.prior_scale = prior_scale

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        d = x.shape[1]
        w = pyro.sample("w", dist.Normal(torch.zeros(d), self.prior_scale).to_event(1))
        with pyro.plate("data", x.shape[0]) as idx:
            pyro.sample(
                "obs",
                dist.Normal(x[idx] @ w, self.noise_scale),
                obs=None if y is None else y[idx],
            )

    def log_joint(
        self,
        params: Mapping[str, torch.Tensor],
        subsample: torch.Tensor | None,
        x: torch.Tensor,
        y: torch.Tensor,
    ) -> torch.Tensor:
        w = params["w"]
        prior = dist.Normal(0.0, self.prior_scale).log_prob(w).sum()
        scale = 1.0
        if subsample is not None:
            scale = x.shape[0] / subsample.shape[0]
            x, y = x[subsample], y[subsample]
        return prior + scale * dist.Normal(x @ w, self.noise_scale).log_prob(y).sum()

    def posterior(self, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        X = x.double().numpy()
        Y = y.double().numpy()
        precision = X.T @ X / self.noise_scale**2 + np.eye(X.shape[1]) / self.prior_scale**2
        covariance = np.linalg.inv(precision)
        return covariance @ X.T @ Y / self.noise_scale**2, covariance


class TraceOnly:
    """Wraps a model so that only Pyro's trace path can be used (no ``log_joint``)."""

    def __init__(self, model) -> None:
        self.model = model

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def regression_data(n: int = 1000, d: int = 5, noise_scale: float = 0.5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=generator)
    w = torch.randn(d, generator=generator)
    y = x @ w + noise_scale * torch.randn(n, generator=generator)
    return x, y
