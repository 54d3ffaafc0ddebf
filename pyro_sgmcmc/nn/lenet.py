r"""LeNet-5 written as a Pyro user writes a Bayesian network: a ``PyroModule`` with ``PyroSample``.

Nothing here is specific to this package: the layers are ``PyroModule[nn.Conv2d]`` and
``PyroModule[nn.Linear]``, every weight and bias gets a ``PyroSample`` prior, and the likelihood
is a ``Categorical`` inside ``pyro.plate("data", x.shape[0])``. The samplers, ``fit_svi`` and the
export take it through the same fast path as any other Pyro model.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

from .priors import placed

__all__ = ["LeNet5"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}


def _normal_prior(module: PyroModule, scale: float, *shape: int) -> PyroSample:
    """``Normal(0, scale)`` weights of ``shape``, on the module's device (:func:`placed`)."""
    return placed(module, dist.Normal, 0.0, scale, shape=shape)


class LeNet5(PyroModule):
    r"""Bayesian LeNet-5 for 28x28 grey-scale images (MNIST, Fashion-MNIST); a Pyro model.

    The network of LeCun et al. (1998) as it is usually run on MNIST: the 28x28 input is padded
    by 2 pixels to LeNet's 32x32, then

    ====================  ===========================================  ============
    layer                 operation                                    output
    ====================  ===========================================  ============
    ``conv1``             5x5 convolution, 6 channels, padding 2       6x28x28
    pool                  activation, 2x2 max-pool                     6x14x14
    ``conv2``             5x5 convolution, 16 channels                 16x10x10
    pool                  activation, 2x2 max-pool                     16x5x5
    ``fc1``               fully connected                              120
    ``fc2``               activation, fully connected                  84
    ``fc3``               activation, fully connected                  10 logits
    ====================  ===========================================  ============

    61,706 weights and biases in all. Every weight and bias :math:`w_j` has the prior
    :math:`w_j \sim \mathcal N(0, s^2)` (``prior_scale`` :math:`s`), and the labels are
    categorical given the logits :math:`f_w(x_i)`:

    .. math::

        p(w, y \mid x) = \prod_j \mathcal N(w_j \mid 0, s^2)
                         \prod_{i=1}^{N} \operatorname{Categorical}\big(y_i \mid
                         \operatorname{softmax} f_w(x_i)\big).

    The latent sites are ``conv1.weight``, ``conv1.bias``, ``conv2.weight``, ``conv2.bias``,
    ``fc1.weight``, ..., ``fc3.bias``; the observed site is ``obs`` in the plate ``"data"``.

    Parameters
    ----------
    prior_scale:
        :math:`s > 0`, the prior standard deviation of every weight and bias.
    activation:
        ``"relu"`` (default) or ``"tanh"`` (LeNet's original squashing units).
    num_classes:
        Number of classes (outputs of ``fc3``).
    in_channels:
        Channels of the input images (1 for grey-scale).

    Notes
    -----
    ``forward(x, y=None)`` takes images of shape ``(N, in_channels, 28, 28)``, or ``(N, 28, 28)``
    / ``(N, 784)`` for one channel (reshaped), and returns the logits ``(N, num_classes)``. The
    plate is sized from the data, so a minibatch is the model run on the minibatch's rows.

    References
    ----------
    Y. LeCun, L. Bottou, Y. Bengio and P. Haffner, "Gradient-based learning applied to document
    recognition", Proceedings of the IEEE 86(11), 2278-2324, 1998.

    Examples
    --------
    >>> import torch
    >>> from pyro_sgmcmc.nn import LeNet5
    >>> model = LeNet5()
    >>> model(torch.rand(3, 1, 28, 28)).shape
    torch.Size([3, 10])
    """

    #: Hidden units can be permuted: convergence is judged on the outputs
    #: (:mod:`pyro_sgmcmc.analysis.diagnostics`).
    function_space = True

    def __init__(
        self,
        prior_scale: float = 1.0,
        activation: str = "relu",
        num_classes: int = 10,
        in_channels: int = 1,
    ) -> None:
        super().__init__()
        if not (isinstance(prior_scale, int | float) and prior_scale > 0):
            raise ValueError(f"prior_scale must be a positive number, got {prior_scale!r}")
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.in_channels = in_channels
        self.activation = _ACTIVATIONS[activation]()
        self.pool = nn.MaxPool2d(2)
        s = float(prior_scale)
        self.conv1 = PyroModule[nn.Conv2d](in_channels, 6, kernel_size=5, padding=2)
        self.conv1.weight = _normal_prior(self.conv1, s, 6, in_channels, 5, 5)
        self.conv1.bias = _normal_prior(self.conv1, s, 6)
        self.conv2 = PyroModule[nn.Conv2d](6, 16, kernel_size=5)
        self.conv2.weight = _normal_prior(self.conv2, s, 16, 6, 5, 5)
        self.conv2.bias = _normal_prior(self.conv2, s, 16)
        self.fc1 = PyroModule[nn.Linear](16 * 5 * 5, 120)
        self.fc1.weight = _normal_prior(self.fc1, s, 120, 16 * 5 * 5)
        self.fc1.bias = _normal_prior(self.fc1, s, 120)
        self.fc2 = PyroModule[nn.Linear](120, 84)
        self.fc2.weight = _normal_prior(self.fc2, s, 84, 120)
        self.fc2.bias = _normal_prior(self.fc2, s, 84)
        self.fc3 = PyroModule[nn.Linear](84, num_classes)
        self.fc3.weight = _normal_prior(self.fc3, s, num_classes, 84)
        self.fc3.bias = _normal_prior(self.fc3, s, num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        x = x.reshape(x.shape[0], self.in_channels, 28, 28)
        h = self.pool(self.activation(self.conv1(x)))
        h = self.pool(self.activation(self.conv2(h)))
        h = self.activation(self.fc1(h.flatten(1)))
        h = self.activation(self.fc2(h))
        logits = self.fc3(h)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits
