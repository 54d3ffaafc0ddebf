"""Workload W5: a Bayesian LeNet-5 written the Pyro way, on Fashion-MNIST, batch 128.

Model: :class:`pyro_sgmcmc.nn.LeNet5`, a ``PyroModule`` whose layers are
``PyroModule[nn.Conv2d]`` / ``PyroModule[nn.Linear]`` with ``PyroSample`` N(0, 1) priors on every
weight and bias (61,706 in all) and a ``Categorical`` likelihood in ``pyro.plate("data",
x.shape[0])``. Data: the Fashion-MNIST training set (60000 images, pixels / 255) and its 10000
test images (synthetic data of the same shape when the data set is missing); batch 128.

Rows:

* **step time** (``--repeats`` interleaved repeats of ``--steps`` steps, medians):

  - the baseline, a plain torch step on a deterministic LeNet-5 with the same layers: zero_grad,
    forward, cross-entropy x N/B + the Gaussian prior term 0.5 |w|^2, backward,
    ``torch.optim.SGD.step``, the minibatch's rows fetched with ``index_select``;
  - SGHMC through ``pyro.infer.MCMC`` on ``LeNet5`` with the default potential (the package
    picks its functional potential for such a model), and Pyro's trace path
    (``potential="trace"``) for reference. Steady state: timed from the first kept draw to the
    last, 25 gradient steps per draw, a fixed small step (no warm-up).

  Target: SGHMC step <= 1.15 x the plain step.

* **accuracy** of the Bayesian model average on the 10000 test images (accuracy, NLL, ECE with
  15 bins), within the wall-clock budget ``--budget`` (seconds; everything counted: set-up,
  warm-up, sampling and the predictive evaluation):

  - SGHMC through ``pyro.infer.MCMC``: by default the package's defaults,
    ``SGHMC(LeNet5(), batch_size=128, seed=...)`` with no step size (the adaptive warm-up chooses
    a per-coordinate step; its first half is a noise-free descent, i.e. a MAP warm start);
    ``--learning-rate`` gives a fixed per-datum step instead (the warm-up is then a plain
    burn-in, started at LeCun-scaled weights and zero biases). ``--warmup-epochs`` epochs of
    warm-up, then sampling at temperature ``--temperature`` with ``--draws-per-epoch`` kept
    draws per epoch until the budget is spent; the predictive is the average softmax over every
    ``--eval-every``-th kept draw, accumulated as the chain runs (the run is stopped at the
    deadline from the MCMC hook). A chain that diverges is reported as such in the table.
    Measured: the adaptive defaults run without divergences on this workload but choose
    conservative steps (test accuracy 0.86-0.87 in the budget; see ``docs/adaptation.md``,
    Limits), so the recorded run uses ``--learning-rate 0.05 --friction 0.1 --temperature 0.1``
    (SGD with momentum 0.9 at rate 0.05, plus the injected noise of a cold posterior);
  - a deterministic LeNet-5 trained with SGD (momentum 0.9, weight decay 1/N = the N(0, 1) prior,
    cosine-annealed learning rate over the same budget) -- the baseline row;
  - mean-field VI: ``pyro_sgmcmc.fit_svi(LeNet5(), x, y, batch_size=128,
    estimator=--svi-estimator)`` (AutoNormal-style guide; Flipout by default, applied to the
    ``PyroModule[nn.Conv2d]`` and ``PyroModule[nn.Linear]`` layers), Adam with a
    cosine-annealed rate ``--svi-lr``, as many steps as fit in the same budget, predictive from
    ``--svi-draws`` guide draws.

  Every accuracy row also reports the *refusal of noise images*: the fraction of ``--noise``
  uniform-noise images (pixels U(0, 1)) whose max predictive probability is < 0.2.

  Targets (10 minutes on 2 cores): SGHMC acc >= 0.915, NLL <= 0.24, ECE <= 0.015 (anchors:
  deterministic LeNet-5 0.910 / 0.321, mean-field VI 0.895 / 0.292); SVI with Flipout >= 0.895
  / <= 0.29.

The recorded JSON came from two invocations (a part skipped keeps the last recorded one): the
accuracy rows on the workload's two cores, ``python benchmarks/w5_lenet.py --skip-timing
--learning-rate 0.05 --friction 0.1 --temperature 0.1 --threads 2`` (about 30 minutes: three
rows of 10 minutes), and the step times on one core, ``taskset -c 1 python
benchmarks/w5_lenet.py --skip-accuracy --steps 150 --repeats 3 --timing-rows 6000`` (the MCMC
set-up runs LeNet-5 on every training row a few times, ~1-3 minutes and ~4.7 GB at N = 60000; a
step's work does not depend on N).

Run: ``taskset -c 0 python benchmarks/w5_lenet.py [--budget 600 --steps 200 --repeats 3]``;
``--quick`` (3000 training rows, budget 40 s, 10 warm-up epochs, 50 timed steps: a smoke test,
~3 minutes), ``--skip-timing``,
``--skip-accuracy``, ``--skip-svi``, ``--skip-sgd``. Writes ``benchmarks/results/w5_lenet.json``
(the quick run writes ``w5_lenet_quick.json``; ``--name`` chooses another name, e.g. for the
separate SGHMC rows of ``docs/adaptation.md``: ``--skip-timing --skip-svi --skip-sgd --threads 2
[--learning-rate 0.02 --friction 0.1] [--temperature 0.1] --name w5_lenet_<row>``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import pyro
import torch
import torch.nn.functional as F
from _common import RESULTS, load_average, print_table, time_torch_sgd_step, write_json
from pyro.infer import MCMC
from pyro.infer.autoguide.initialization import init_to_median
from torch import nn

from pyro_sgmcmc import SGHMC, SamplerDivergedError, fit_svi, metrics
from pyro_sgmcmc.models.initialization import init_to_fan_in
from pyro_sgmcmc.nn import LeNet5

STEP_TARGET = 1.15
TARGETS = {"accuracy": 0.915, "nll": 0.24, "ece": 0.015}
SVI_TARGETS = {"accuracy": 0.895, "nll": 0.29}
REFUSAL_THRESHOLD = 0.2


class PlainLeNet5(nn.Module):
    """The deterministic LeNet-5 with the layers (and parameter names) of ``LeNet5``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], 1, 28, 28)
        h = self.pool(F.relu(self.conv1(x)))
        h = self.pool(F.relu(self.conv2(h)))
        h = F.relu(self.fc1(h.flatten(1)))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


def load():
    try:
        from pyro_sgmcmc.data.datasets import load_dataset

        d = load_dataset("fashion_mnist", seed=0)
        return (d.x_train.reshape(-1, 784).float(), d.y_train.long(),
                d.x_test.reshape(-1, 784).float(), d.y_test.long(), "fashion_mnist")  # fmt: skip
    except Exception:  # fall back to synthetic data of the same shape
        g = torch.Generator().manual_seed(0)
        return (torch.rand(60000, 784, generator=g), torch.randint(0, 10, (60000,), generator=g),
                torch.rand(10000, 784, generator=g), torch.randint(0, 10, (10000,), generator=g),
                "synthetic")  # fmt: skip


# ---------------------------------------------------------------------------- step time
def time_baseline(x, y, batch_size, steps, generator) -> float:
    return time_torch_sgd_step(PlainLeNet5(), x, y, batch_size, steps, generator)


def time_mcmc(x, y, batch_size, steps, potential) -> float:
    steps_per_sample = 25
    draws = max(steps // steps_per_sample, 2) + 1
    stamps: list[float] = []
    kernel = SGHMC(LeNet5(), learning_rate=1e-3, batch_size=batch_size,
                   num_steps_per_sample=steps_per_sample, potential=potential, seed=0)  # fmt: skip
    mcmc = MCMC(kernel, num_samples=draws, warmup_steps=0, disable_progbar=True,
                hook_fn=lambda *args: stamps.append(time.perf_counter()))  # fmt: skip
    mcmc.run(x, y)
    return (stamps[-1] - stamps[0]) / ((draws - 1) * steps_per_sample)


# ---------------------------------------------------------------------------- predictive
def evaluate(probs: torch.Tensor, y: torch.Tensor, noise_probs: torch.Tensor) -> dict:
    return {
        "accuracy": metrics.accuracy(probs, y),
        "nll": metrics.negative_log_likelihood(probs, y),
        "ece": metrics.expected_calibration_error(probs, y),
        "confidence": float(probs.max(-1).values.mean()),
        "noise_refusal": float((noise_probs.max(-1).values < REFUSAL_THRESHOLD).double().mean()),
    }


class Predictive:
    """Running average of the softmax over weight draws, on the test and the noise images."""

    def __init__(self, x_eval: torch.Tensor, chunk: int = 2500) -> None:
        self.net = PlainLeNet5()
        self.x = x_eval
        self.chunk = chunk
        self.sum = torch.zeros(x_eval.shape[0], 10, dtype=torch.float64)
        self.count = 0
        self.seconds = 0.0

    @torch.no_grad()
    def add(self, draw: dict[str, torch.Tensor]) -> None:
        start = time.perf_counter()
        params = {k: v.detach().reshape(self.net.get_parameter(k).shape) for k, v in draw.items()}
        for i in range(0, self.x.shape[0], self.chunk):
            logits = torch.func.functional_call(self.net, params, (self.x[i : i + self.chunk],))
            self.sum[i : i + self.chunk] += logits.double().softmax(-1)
        self.count += 1
        self.seconds += time.perf_counter() - start

    def probs(self) -> torch.Tensor:
        return self.sum / self.count


class _Deadline(Exception):
    pass


def run_sghmc(x, y, x_eval, args) -> dict:
    """SGHMC with the default (adaptive) settings through MCMC until the budget is spent."""
    start = time.perf_counter()
    deadline = start + args.budget
    steps_per_epoch = x.shape[0] // args.batch_size
    thinning = max(1, round(steps_per_epoch / args.draws_per_epoch))
    warmup_draws = max(1, round(args.warmup_epochs * steps_per_epoch / thinning))
    predictive = Predictive(x_eval)
    log = {"warmup_end": None, "kept": 0, "first_kept": None, "last_kept": None}

    def hook(kernel, params, stage, i):
        now = time.perf_counter()
        if stage.startswith("Sample"):
            if log["first_kept"] is None:
                log["first_kept"] = now
            log["last_kept"] = now
            if log["kept"] % args.eval_every == 0:
                predictive.add(params)  # LeNet5's sites are unconstrained (real support)
            log["kept"] += 1
        elif i == warmup_draws - 1:
            log["warmup_end"] = now
            print(f"  SGHMC warm-up done after {now - start:.0f} s", flush=True)
        if time.perf_counter() >= deadline:
            raise _Deadline

    options = {}
    if args.learning_rate is not None:  # a fixed per-datum step: warm-up = burn-in
        options = {"learning_rate": args.learning_rate,
                   "init_strategy": init_to_fan_in(math.sqrt(3.0), init_to_median)}  # fmt: skip
    if args.friction is not None:
        options["friction"] = args.friction
    kernel = SGHMC(LeNet5(), batch_size=args.batch_size, num_steps_per_sample=thinning,
                   temperature=args.temperature, seed=args.seed, **options)  # fmt: skip
    mcmc = MCMC(kernel, num_samples=10**7, warmup_steps=warmup_draws, disable_progbar=True,
                hook_fn=hook)  # fmt: skip
    diverged = None
    try:
        mcmc.run(x, y)
    except _Deadline:
        pass
    except SamplerDivergedError as error:
        diverged = str(error).split(". ")[0]
        print(f"  {diverged}", flush=True)
    seconds = time.perf_counter() - start
    report = kernel.diagnostics()
    divergences = {"divergent_draws": len(report["divergences"]),
                   "warmup_divergences": report["warmup_divergences"]}  # fmt: skip
    if diverged is not None and predictive.count == 0:
        return {"diverged": diverged, "seconds": seconds, **divergences}
    if predictive.count == 0:
        raise RuntimeError(f"the budget of {args.budget} s ended before the warm-up did")
    kept, first, last = log["kept"], log["first_kept"], log["last_kept"]
    s_per_step = (last - first) / ((kept - 1) * thinning) if kept > 1 else float("nan")
    return {
        "probs": predictive.probs(),
        "seconds": seconds,
        "diverged": diverged,
        "warmup_seconds": None if log["warmup_end"] is None else log["warmup_end"] - start,
        "warmup_epochs": warmup_draws * thinning / steps_per_epoch,
        "sampling_epochs": kept * thinning / steps_per_epoch,
        "kept_draws": kept,
        "draws_averaged": predictive.count,
        "thinning": thinning,
        "eval_seconds": predictive.seconds,
        "s_per_step_sampling_incl_eval": s_per_step,
        **divergences,
    }


def run_sgd(x, y, x_eval, args) -> dict:
    """Deterministic LeNet-5, SGD with momentum 0.9, weight decay 1/N, cosine rate, same budget."""
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    net = PlainLeNet5()
    optimizer = torch.optim.SGD(net.parameters(), lr=args.sgd_lr, momentum=0.9,
                                weight_decay=1.0 / x.shape[0])  # fmt: skip
    generator = torch.Generator().manual_seed(args.seed)
    n, b = x.shape[0], args.batch_size
    steps, done = 0, False
    while not done:
        permutation = torch.randperm(n, generator=generator)
        for i in range(n // b):
            elapsed = time.perf_counter() - start
            if elapsed >= args.budget - 2.0:  # keep ~2 s for the evaluation
                done = True
                break
            for group in optimizer.param_groups:
                group["lr"] = args.sgd_lr * 0.5 * (1 + math.cos(math.pi * elapsed / args.budget))
            idx = permutation[i * b : (i + 1) * b]
            optimizer.zero_grad()
            F.cross_entropy(net(x.index_select(0, idx)), y.index_select(0, idx)).backward()
            optimizer.step()
            steps += 1
    with torch.no_grad():
        probs = torch.cat([net(c) for c in x_eval.split(2500)]).double().softmax(-1)
    return {"probs": probs, "seconds": time.perf_counter() - start, "epochs": steps * b / n}


def run_svi(x, y, x_eval, args) -> dict:
    """Mean-field VI through ``fit_svi``: as many Adam steps as fit in the budget.

    The seconds per step are measured first on a 2000-row subset (steps 5 to 30; the per-step
    work does not depend on N), the set-up on the full data (model runs on all rows) is
    estimated from one full-data forward; the run is then given the steps that fit.
    """
    start = time.perf_counter()
    stamps: list[float] = []
    fit_svi(LeNet5(), x[:2000], y[:2000], batch_size=args.batch_size, num_steps=30,
            learning_rate=args.svi_lr, seed=args.seed, estimator=args.svi_estimator,
            progress_bar=False,
            callback=lambda *a: stamps.append(time.perf_counter()))  # fmt: skip
    s_per_step = (stamps[-1] - stamps[4]) / (len(stamps) - 5)
    probe = time.perf_counter()
    with torch.no_grad():
        LeNet5()(x, y)
    setup_estimate = 5 * (time.perf_counter() - probe)
    remaining = args.budget - (time.perf_counter() - start) - setup_estimate - 5.0
    num_steps = max(1, int(remaining / s_per_step))

    def cosine(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda t: 0.5 * (1 + math.cos(math.pi * min(t / num_steps, 1.0)))
        )

    result = fit_svi(LeNet5(), x, y, batch_size=args.batch_size, num_steps=num_steps,
                     learning_rate=args.svi_lr, lr_scheduler=cosine, seed=args.seed,
                     estimator=args.svi_estimator, progress_bar=False)  # fmt: skip
    draws = result.sample_posterior(args.svi_draws, seed=args.seed)
    predictive = Predictive(x_eval)
    for s in range(args.svi_draws):
        predictive.add({name: value[0, s] for name, value in draws.items()})
    return {
        "probs": predictive.probs(),
        "seconds": time.perf_counter() - start,
        "fit_seconds": result.wall_time,
        "num_steps": num_steps,
        "epochs": num_steps * args.batch_size / x.shape[0],
        "s_per_step_estimate": s_per_step,
        "final_loss": float(result.losses[0, -50:].mean()),
    }


def _fmt(m: dict) -> str:
    return f"{m['accuracy']:.3f} / {m['nll']:.3f} / {m['ece']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test (~3 minutes)")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per accuracy row")
    parser.add_argument("--warmup-epochs", type=float, default=10.0)
    parser.add_argument("--draws-per-epoch", type=float, default=2.0)
    parser.add_argument("--eval-every", type=int, default=1, help="evaluate every k-th draw")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="per-datum SGHMC step (default: none, the adaptive warm-up)",
    )
    parser.add_argument("--friction", type=float, default=None, help="default: the kernel's")
    parser.add_argument("--sgd-lr", type=float, default=0.05)
    parser.add_argument("--svi-lr", type=float, default=2e-3)
    parser.add_argument(
        "--svi-estimator",
        default="flipout",
        choices=["flipout", "local_reparameterization", "reparameterization"],
    )
    parser.add_argument("--svi-draws", type=int, default=32)
    parser.add_argument("--noise", type=int, default=2000, help="uniform-noise images")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-rows", type=int, default=None,
                        help="use only so many training rows (smoke tests)")  # fmt: skip
    parser.add_argument("--timing-rows", type=int, default=None,
                        help="training rows for the step-time rows (default all): the set-up "
                        "runs the model on every row, a step does not depend on N")  # fmt: skip
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-svi", action="store_true")
    parser.add_argument("--skip-sgd", action="store_true", help="no deterministic SGD row")
    parser.add_argument("--name", default=None, help="results file (w5_lenet[_quick])")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.budget, args.warmup_epochs = 50, 1, 40.0, 10.0
        args.svi_draws, args.train_rows, args.timing_rows = 4, 3000, 3000
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(args.seed)
    x, y, x_test, y_test, source = load()
    if args.train_rows:
        x, y = x[: args.train_rows], y[: args.train_rows]
    noise = torch.rand(args.noise, 784, generator=torch.Generator().manual_seed(1))
    x_eval = torch.cat([x_test, noise])
    n_test = x_test.shape[0]
    load_start = load_average()
    result_name = args.name or ("w5_lenet_quick" if args.quick else "w5_lenet")
    previous = RESULTS / f"{result_name}.json"
    previous = json.loads(previous.read_text()) if previous.exists() else {}
    # a skipped part keeps what the last run wrote for it (marked with its own settings)
    sections: dict[str, dict] = {
        part: previous[part] for part in ("timing", "accuracy") if part in previous
    }
    settings = vars(args)

    if not args.skip_timing:
        generator = torch.Generator().manual_seed(0)
        xt, yt = (x, y) if not args.timing_rows else (x[: args.timing_rows], y[: args.timing_rows])
        timings: dict[str, list[float]] = {"baseline": [], "functional": [], "trace": []}
        for _ in range(args.repeats):
            b, steps = args.batch_size, args.steps
            timings["baseline"].append(time_baseline(xt, yt, b, steps, generator))
            timings["functional"].append(time_mcmc(xt, yt, b, steps, "auto"))
            timings["trace"].append(time_mcmc(xt, yt, b, steps, "trace"))
            print({k: f"{1e3 * v[-1]:.2f} ms" for k, v in timings.items()}, flush=True)
        median = {name: statistics.median(values) for name, values in timings.items()}
        base, ratio = median["baseline"], median["functional"] / median["baseline"]
        rows = [
            {"row": "step: torch SGD step, plain LeNet-5 (baseline)",
             "result": f"{1e3 * base:.2f} ms", "ratio": "1.00"},
            {"row": "step: SGHMC via MCMC, default potential",
             "result": f"{1e3 * median['functional']:.2f} ms", "ratio": f"{ratio:.2f}",
             "target": f"ratio <= {STEP_TARGET}", "pass": ratio <= STEP_TARGET},
            {"row": "step: SGHMC via MCMC, potential='trace'",
             "result": f"{1e3 * median['trace']:.2f} ms",
             "ratio": f"{median['trace'] / base:.2f}"},
        ]  # fmt: skip
        sections["timing"] = {"rows": rows, "settings": settings, "s_per_step": timings,
                              "ratio_step": ratio, "step_target": STEP_TARGET,
                              "load_average": [load_start, load_average()]}  # fmt: skip

    if not args.skip_accuracy:
        columns = "acc / NLL / ECE"
        runs, rows = {}, []
        accuracy_load = load_average()
        print("SGHMC ...", flush=True)
        sghmc = run_sghmc(x, y, x_eval, args)
        sgd_load = load_average()
        completed = [("sghmc", sghmc)]
        if not args.skip_sgd:
            print("SGD ...", flush=True)
            completed.append(("sgd", run_sgd(x, y, x_eval, args)))
        for name, run in completed:
            if "probs" in run:
                probs = run.pop("probs")
                run.update(evaluate(probs[:n_test], y_test, probs[n_test:]))
            runs[name] = run
        s = runs["sghmc"]
        if args.learning_rate is None:
            how = "defaults (adaptive warm-up)"
        else:
            how = f"learning_rate={args.learning_rate:g} per datum"
        if args.friction is not None:
            how += f", friction={args.friction:g}"
        if "accuracy" not in s:
            rows.append({"row": f"SGHMC {how}: {s['diverged']}", "seconds": f"{s['seconds']:.0f}",
                         "target": ">= 0.915 / <= 0.24 / <= 0.015", "pass": False})  # fmt: skip
        else:
            passed = (s["accuracy"] >= TARGETS["accuracy"] and s["nll"] <= TARGETS["nll"]
                      and s["ece"] <= TARGETS["ece"])  # fmt: skip
            rows.append({
                "row": f"SGHMC {how}, T={args.temperature:g}, {s['warmup_epochs']:.0f} warm-up + "
                       f"{s['sampling_epochs']:.1f} sampling epochs, {s['draws_averaged']} draws"
                       + f", {s['divergent_draws']} divergent draws"
                       + (f" -- then {s['diverged']}" if s["diverged"] else ""),
                columns: _fmt(s), "noise refused": f"{s['noise_refusal']:.3f}",
                "seconds": f"{s['seconds']:.0f}",
                "target": ">= 0.915 / <= 0.24 / <= 0.015", "pass": passed,
            })  # fmt: skip
        d = runs.get("sgd")
        if d is not None:
            rows.append({
                "row": f"deterministic LeNet-5, SGD, {d['epochs']:.1f} epochs",
                columns: _fmt(d), "noise refused": f"{d['noise_refusal']:.3f}",
                "seconds": f"{d['seconds']:.0f}", "target": "anchor 0.910 / 0.321",
            })  # fmt: skip
        if not args.skip_svi:
            print("SVI ...", flush=True)
            svi = run_svi(x, y, x_eval, args)
            probs = svi.pop("probs")
            svi.update(evaluate(probs[:n_test], y_test, probs[n_test:]))
            runs["svi"] = svi
            rows.append({
                "row": f"mean-field VI (fit_svi, {args.svi_estimator}), {svi['epochs']:.1f} "
                       f"epochs, {args.svi_draws} draws",
                columns: _fmt(svi), "noise refused": f"{svi['noise_refusal']:.3f}",
                "seconds": f"{svi['seconds']:.0f}",
                "target": ">= 0.895 / <= 0.29",
                "pass": svi["accuracy"] >= SVI_TARGETS["accuracy"]
                        and svi["nll"] <= SVI_TARGETS["nll"],
            })  # fmt: skip
        loads = [accuracy_load, sgd_load, load_average()]  # start, SGD start, end
        sections["accuracy"] = {"rows": rows, "settings": settings, "runs": runs,
                                "targets": TARGETS, "svi_targets": SVI_TARGETS,
                                "load_average": loads}  # fmt: skip

    load_end = load_average()
    print(f"data: {source}; batch {args.batch_size}; {args.threads} thread(s); budget "
          f"{args.budget:g} s per accuracy row; load {load_start} -> {load_end}")  # fmt: skip
    rows = [
        row for part in ("timing", "accuracy") for row in sections.get(part, {}).get("rows", [])
    ]
    print_table(rows, ["row", "result", "ratio", "acc / NLL / ECE", "noise refused", "seconds",
                       "target", "pass"])  # fmt: skip
    payload = {"data": source, **sections, "rows": rows, "load_average_end": load_end}
    path = write_json(result_name, payload)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
