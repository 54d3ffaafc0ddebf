r"""Check that a refactoring changed no behaviour: the same seeded runs give the same bytes.

A fixed set of seeded runs covers every public path the package's layout could disturb: each
kernel through ``pyro.infer.MCMC`` and through :func:`~pyro_sgmcmc.run_chains` (the adaptive
warm-up included), :func:`~pyro_sgmcmc.fit_svi`, :func:`~pyro_sgmcmc.to_inference_data` of an
MCMC run and of an SVI fit, and the ``summary.json`` of ``pyro-sgmcmc compare``. Each result is
reduced to a SHA-256 of its raw bytes (tensors via ``numpy().tobytes()`` with dtype and shape, so
equal digests mean ``torch.equal``; the JSON with its timing fields removed, byte for byte).

Usage::

    python tests/layout_identity.py                  # print this tree's digests as JSON
    python tests/layout_identity.py --against REV    # compare with git revision REV

``--against`` checks ``REV`` out into a temporary ``git worktree``, runs this same script there
(with that tree's package first on ``sys.path``) and here, each in a fresh interpreter, and
exits 1 listing every run whose digest differs. Digests depend on the CPU and the library
versions, so compare two trees on one machine, never with digests recorded elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Timing fields of ``summary.json``: the only values two identical runs may differ in.
TIMING_KEYS = ("seconds", "time", "ess_per_second", "per_second", "wall")


def _digest_tensor(hasher: Any, value: Any) -> None:
    import numpy as np
    import torch

    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    hasher.update(f"{array.dtype}{array.shape}".encode())
    hasher.update(np.ascontiguousarray(array).tobytes())


def digest(mapping: dict[str, Any]) -> str:
    """SHA-256 of a mapping of arrays or tensors, over sorted keys."""
    hasher = hashlib.sha256()
    for key in sorted(mapping):
        hasher.update(key.encode())
        _digest_tensor(hasher, mapping[key])
    return hasher.hexdigest()


def _data() -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(120, 2, generator=generator)
    y = x @ torch.tensor([1.5, -0.7]) + 0.3 + 0.5 * torch.randn(120, generator=generator)
    return x, y


def _model(x: Any, y: Any = None) -> Any:
    import pyro
    import pyro.distributions as dist

    weight = pyro.sample("weight", dist.Normal(0.0, 2.0).expand([2]).to_event(1))
    bias = pyro.sample("bias", dist.Normal(0.0, 5.0))
    sigma = pyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", x.shape[0]):
        return pyro.sample("obs", dist.Normal(x @ weight + bias, sigma), obs=y)


def _kernels() -> dict[str, Any]:
    from pyro_sgmcmc import PSGLD, SGHMC, SGLD, ConstantSGD

    return {"sgld": SGLD, "sghmc": SGHMC, "psgld": PSGLD, "constant_sgd": ConstantSGD}


def _mcmc_runs(results: dict[str, str]) -> Any:
    import pyro
    from pyro.infer import MCMC

    from pyro_sgmcmc import to_inference_data

    x, y = _data()
    last = None
    for name, kernel_class in _kernels().items():
        pyro.set_rng_seed(0)
        mcmc = MCMC(
            kernel_class(_model, batch_size=20, seed=1),
            num_samples=15,
            warmup_steps=30,
            disable_progbar=True,
        )
        mcmc.run(x, y)
        results[f"mcmc/{name}"] = digest(mcmc.get_samples())
        last = mcmc
    results["export/mcmc"] = _digest_inference_data(to_inference_data(last))
    return last


def _vectorized_runs(results: dict[str, str]) -> None:
    from pyro_sgmcmc import run_chains

    x, y = _data()
    for name, kernel_class in _kernels().items():
        result = run_chains(
            kernel_class(_model, batch_size=20, seed=2), x, y,
            num_chains=3, num_samples=15, warmup_steps=40,
        )  # fmt: skip
        stats = {f"stats.{key}": value for key, value in result.sample_stats.items()}
        results[f"run_chains/{name}"] = digest({**result.samples, **stats})


def _svi_runs(results: dict[str, str]) -> None:
    from pyro_sgmcmc import fit_svi, to_inference_data

    x, y = _data()
    fit = fit_svi(_model, x, y, num_steps=60, batch_size=20, seed=3, progress_bar=False)
    results["svi/losses"] = digest({"losses": fit.losses})
    results["export/svi"] = _digest_inference_data(to_inference_data(fit, num_draws=20))


def _digest_inference_data(result: Any) -> str:
    from pyro_sgmcmc import _arviz

    arrays = {}
    for group in sorted(_arviz.group_names(result)):
        dataset = _arviz.get_group(result, group)
        for name in sorted(dataset.data_vars):
            arrays[f"{group}/{name}"] = dataset[name].values
    return digest(arrays)


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_timings(item)
            for key, item in value.items()
            if not any(marker in key for marker in TIMING_KEYS)
        }
    if isinstance(value, list):
        return [_without_timings(item) for item in value]
    return value


def _cli_run(results: dict[str, str]) -> None:
    from pyro_sgmcmc.cli import main

    tiny = [
        "--chains", "2", "--hidden", "3", "--num-samples", "6", "--warmup", "8",
        "--nuts-num-samples", "6", "--nuts-warmup", "4", "--max-tree-depth", "3",
        "--nuts-init-steps", "20", "--steps-per-sample", "3", "--target-ess", "none",
        "--svi-steps", "20", "--no-progress",
    ]  # fmt: skip
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        # a relative --out: summary.json names its files, and must not name a random directory
        os.chdir(tmp)
        try:
            code = main(["compare", "--dataset", "sinusoid", "--out", "results", *tiny])
            summary = json.loads(Path("results", "summary.json").read_text())
        finally:
            os.chdir(here)
    text = json.dumps(_without_timings(summary), sort_keys=True, indent=1)
    results["cli/summary.json"] = hashlib.sha256(f"{code}{text}".encode()).hexdigest()


def fingerprint() -> dict[str, str]:
    """Digest of every seeded run of the set, by run name."""
    import contextlib
    import io
    import warnings

    results: dict[str, str] = {}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        _mcmc_runs(results)
        _vectorized_runs(results)
        _svi_runs(results)
        _cli_run(results)
    return results


def _fingerprint_of(tree: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    command = [sys.executable, str(Path(__file__).resolve()), "--print"]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def compare_with(revision: str) -> int:
    """Compare this tree's digests with ``revision``'s; 0 when every run is identical."""
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "tree"
        git = ["git", "-C", str(root)]
        add = ["worktree", "add", "-q", "--detach", str(other), revision]
        subprocess.run([*git, *add], check=True)
        try:
            before = _fingerprint_of(other)
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(other)], check=True)
    after = _fingerprint_of(root)
    names = sorted(before.keys() | after.keys())
    differing = [name for name in names if before.get(name) != after.get(name)]
    for name in names:
        print(f"{'DIFFERS' if name in differing else 'same   '} {name}")
    print(f"{len(differing)} of {len(names)} runs differ from {revision}")
    return 1 if differing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="git revision to compare with")
    parser.add_argument("--print", action="store_true", help="print this tree's digests")
    options = parser.parse_args(argv)
    if options.against:
        return compare_with(options.against)
    print(json.dumps(fingerprint(), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
