"""The ``pyro-sgmcmc`` command line.

``pyro-sgmcmc compare`` runs :func:`pyro_sgmcmc.compare.run_comparison` and prints one row per
method; ``pyro-sgmcmc datasets`` lists the built-in data sets. With no options, ``compare`` runs
the seed-004 sinusoid with a small Bayesian MLP, every method included, in a few minutes on two
CPU cores.

Exit status: 0 when at least one method produced results, 1 when every method failed (the
table and ``summary.json`` are still written), 2 for invalid arguments, an unavailable data set
or an output directory that cannot be written (nothing has been sampled then). Set the
environment variable ``PYRO_SGMCMC_DEBUG=1`` to print the traceback of a method that fails.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from .compare import ACTIVATIONS, METHODS, NOISES, PRIORS, CompareConfig, run_comparison
from .datasets import dataset_task, list_datasets

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_ALL_FAILED, EXIT_USAGE = 0, 1, 2

_DEFAULTS = {f.name: f.default for f in fields(CompareConfig)}


def _comma_list(kind: Callable[[str], Any], what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        try:
            return tuple(kind(item) for item in items)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from error

    return parse


def _hidden(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return _comma_list(int, "integers such as 16,16")(text)


def _default(name: str) -> str:
    value = _DEFAULTS[name]
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pyro-sgmcmc``."""
    parser = argparse.ArgumentParser(
        prog="pyro-sgmcmc",
        description="Stochastic-gradient MCMC for Bayesian neural networks in Pyro.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    commands.add_parser("datasets", help="list the built-in data sets")
    compare = commands.add_parser(
        "compare",
        help="compare NUTS, SGHMC, SGLD, pSGLD and SVI on one data set",
        description=(
            "Fit one Bayesian MLP with several inference methods and compare wall time, test "
            "metrics and convergence. Exit status: 0 if at least one method succeeded, 1 if all "
            "failed, 2 for invalid arguments or unusable inputs. Defaults: the seed-004 sinusoid "
            "with a small net, all methods, NUTS bounded (tree depth, draws) to finish quickly."
        ),
    )
    compare.set_defaults(subparser=compare)
    add = compare.add_argument
    add(
        "--dataset",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=f"one of: {', '.join(list_datasets())} (default: {_default('dataset')})",
    )
    add(
        "--methods",
        type=_comma_list(str, "method names"),
        default=argparse.SUPPRESS,
        help=f"comma-separated subset of {','.join(METHODS)} (default: all)",
    )
    add("--chains", type=int, default=argparse.SUPPRESS, help=f"default {_default('chains')}")
    add("--seed", type=int, default=argparse.SUPPRESS, help=f"default {_default('seed')}")
    add("--out", default=argparse.SUPPRESS, metavar="DIR", help="output directory (results/)")
    add("--no-output", action="store_true", help="write no files, only print the table")
    add(
        "--time-budget",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="skip the methods that would start after this many seconds",
    )

    model = compare.add_argument_group("model")
    model.add_argument(
        "--hidden",
        type=_hidden,
        default=argparse.SUPPRESS,
        metavar="W1,W2",
        help=f"hidden widths (default {_default('hidden')})",
    )
    model.add_argument(
        "--activation",
        default=argparse.SUPPRESS,
        help=f"one of {', '.join(ACTIVATIONS)} (default {_default('activation')})",
    )
    model.add_argument(
        "--prior",
        default=argparse.SUPPRESS,
        help=f"one of {', '.join(PRIORS)} (default {_default('prior')})",
    )
    model.add_argument(
        "--prior-scale",
        type=float,
        default=argparse.SUPPRESS,
        help=f"scale of the Normal prior (default {_default('prior_scale')})",
    )
    model.add_argument(
        "--noise",
        default=argparse.SUPPRESS,
        help=f"regression noise, one of {', '.join(NOISES)} (default {_default('noise')})",
    )
    model.add_argument(
        "--noise-scale",
        type=float,
        default=argparse.SUPPRESS,
        help="noise scale (fixed) or its prior scale, standardised units "
        f"(default {_default('noise_scale')})",
    )

    sampling = compare.add_argument_group("sampling")
    options: Sequence[tuple[str, str, type, str]] = (
        ("--num-samples", "num_samples", int, "kept draws per chain (SG-MCMC; SVI draws per fit)"),
        ("--warmup", "warmup", int, "warm-up draws per chain (SG-MCMC)"),
        ("--nuts-num-samples", "nuts_num_samples", int, "NUTS draws per chain"),
        ("--nuts-warmup", "nuts_warmup", int, "NUTS warm-up draws per chain"),
        ("--max-tree-depth", "max_tree_depth", int, "NUTS maximum tree depth"),
        ("--sgld-lr", "sgld_learning_rate", float, "SGLD per-datum learning rate (step = lr/N)"),
        ("--sghmc-lr", "sghmc_learning_rate", float, "SGHMC per-datum learning rate"),
        ("--psgld-lr", "psgld_learning_rate", float, "pSGLD per-datum learning rate"),
        ("--friction", "friction", float, "SGHMC friction in (0, 1]"),
        ("--batch-size", "batch_size", int, "minibatch size (capped at N)"),
        ("--steps-per-sample", "num_steps_per_sample", int, "gradient steps per kept draw"),
        ("--svi-steps", "svi_steps", int, "Adam steps per SVI fit"),
        ("--svi-lr", "svi_learning_rate", float, "SVI Adam learning rate"),
    )
    for flag, dest, kind, text in options:
        sampling.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"{text} (default {_default(dest)})",
        )

    data = compare.add_argument_group("data")
    data.add_argument(
        "--test-fraction",
        type=float,
        default=argparse.SUPPRESS,
        help=f"held-out share (default {_default('test_fraction')})",
    )
    data.add_argument(
        "--max-train",
        type=int,
        default=argparse.SUPPRESS,
        help="use a seeded subset of at most this many training rows",
    )
    data.add_argument(
        "--max-test", type=int, default=argparse.SUPPRESS, help="use at most this many test rows"
    )
    data.add_argument(
        "--data-dir", default=argparse.SUPPRESS, help="directory of the Fashion-MNIST IDX files"
    )

    display = compare.add_argument_group("display")
    display.add_argument("--no-progress", action="store_true", help="hide progress bars")
    display.add_argument("--no-figures", action="store_true", help="write no PNG figures")
    display.add_argument("--quiet", action="store_true", help="print only the table")
    return parser


def _config(args: argparse.Namespace) -> CompareConfig:
    names = {f.name for f in fields(CompareConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if args.no_output:
        values["out"] = None
    values["progress"] = not (args.no_progress or args.quiet)
    values["figures"] = not args.no_figures
    return CompareConfig(**values)


def _compare(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except (ValueError, TypeError) as error:
        args.subparser.error(str(error))
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        results = run_comparison(config, log=log)
    except (OSError, ImportError, ValueError) as error:
        # raised before any sampling: unwritable output, missing data or optional package
        print(f"pyro-sgmcmc compare: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print()
    print(
        f"{results.dataset} ({results.task}): {results.num_train} train / "
        f"{results.num_test} test rows, total {results.total_time:.1f} s"
    )
    print(results.table())
    for line in results.messages():
        print(f"  {line}")
    if config.out is not None:
        print(f"results written to {config.out}/ (summary.json, summary.md, *.nc, *.png)")
    if results.all_failed:
        print("every method failed", file=sys.stderr)
        return EXIT_ALL_FAILED
    return EXIT_OK


def _datasets() -> int:
    for name in list_datasets():
        print(f"{name:15s} {dataset_task(name)}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyro-sgmcmc`` console script; returns the exit status.

    Parameters
    ----------
    argv:
        Arguments without the program name (default: ``sys.argv[1:]``).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "datasets":
        return _datasets()
    return _compare(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
