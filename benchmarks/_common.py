"""Helpers shared by the benchmark scripts: data, timing, JSON output and the result table."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def fashion_mnist_or_synthetic(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Fashion-MNIST training set (pixels / 255), or synthetic data of the same shape."""
    try:
        from pyro_sgmcmc.data.datasets import load_dataset

        data = load_dataset("fashion_mnist", seed=seed)
        return data.x_train.reshape(-1, 784).float(), data.y_train.long(), "fashion_mnist"
    except Exception:  # the data set is optional: fall back to the same shape
        generator = torch.Generator().manual_seed(seed)
        x = torch.rand(60000, 784, generator=generator)
        y = torch.randint(0, 10, (60000,), generator=generator)
        return x, y, "synthetic (Fashion-MNIST not installed)"


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), "time": time.time(), **payload}
    path.write_text(json.dumps(payload, indent=2))
    return path


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-+-".join("-" * widths[c] for c in columns))
    for row in rows:
        print(" | ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns))


def checkouts(against: Path | None) -> dict[str, Path]:
    """This checkout and, with ``--against DIR``, another one measured the same way, by the
    names the tables show."""
    found = {"this checkout": Path(__file__).resolve().parent.parent}
    if against is not None:
        found[str(against)] = against.resolve()
    return found


def load_average() -> list[float]:
    """``os.getloadavg()``: timings taken under load (> cpu count) are inflated."""
    return [round(v, 2) for v in os.getloadavg()]


def sinusoid_w2(seed: int = 4) -> dict[str, torch.Tensor]:
    """Workload W2 (seed 004): 32 points, x = linspace(-0.5, 0.5), y = 10 sin(2 pi x) + N(0, 1),
    and 200 test points with x ~ U(-0.5, 0.5) from the same generator."""
    import math

    generator = torch.Generator().manual_seed(seed)
    x = torch.linspace(-0.5, 0.5, 32).unsqueeze(-1)
    y = 10 * torch.sin(2 * math.pi * x.squeeze(-1)) + torch.randn(32, generator=generator)
    x_test = torch.rand(200, 1, generator=generator) - 0.5
    y_test = 10 * torch.sin(2 * math.pi * x_test.squeeze(-1)) + torch.randn(
        200, generator=generator
    )
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test}


def w2_model():
    """The W2 network: BNN 1-20-20-1, tanh, N(0, 1) priors, Normal likelihood with sigma 1."""
    from pyro_sgmcmc.nn import BayesianMLP

    return BayesianMLP(1, [20, 20], 1, activation="tanh", likelihood="normal", prior="normal")


def time_torch_sgd_step(net, x, y, batch_size, steps, generator, gather="index_select") -> float:
    """Seconds per plain torch SGD step of ``net`` (the benchmarks' baseline): rows of a random
    permutation, fetched with ``index_select`` (or ``x[idx]`` with ``gather="index"``),
    zero_grad, cross-entropy x N/B plus a N(0, 1) prior term, backward, ``optimizer.step``;
    20 steps of warm-up, then ``steps`` timed."""
    import torch.nn.functional as F

    n = x.shape[0]
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-7)
    scale = n / batch_size
    permutation = torch.randperm(n, generator=generator)

    def step(i: int) -> None:
        idx = permutation[(i * batch_size) % (n - batch_size) :][:batch_size]
        if gather == "index_select":
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        else:
            xb, yb = x[idx], y[idx]
        optimizer.zero_grad()
        loss = F.cross_entropy(net(xb), yb, reduction="sum") * scale
        loss = loss + 0.5 * sum(p.square().sum() for p in net.parameters())
        loss.backward()
        optimizer.step()

    for i in range(20):
        step(i)
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return (time.perf_counter() - start) / steps
