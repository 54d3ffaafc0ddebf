"""The ``pyro-sgmcmc`` command line.

``pyro-sgmcmc compare`` runs :func:`pyro_sgmcmc.cli.compare.run_comparison` and prints one row per
method; ``pyro-sgmcmc sample`` runs one method and writes its ``InferenceData`` as netCDF
(:func:`pyro_sgmcmc.cli.compare.sample_to_file`); ``pyro-sgmcmc datasets`` lists the built-in data
sets. Both commands take a built-in set (``--dataset``) or your own table (``--data FILE --target
COLUMN``). With no options, ``compare`` runs the sinusoid toy with a small Bayesian MLP, every
method included, in about three minutes on two CPU cores.

Exit status: 0 when at least one method produced results, 1 when every method failed (the
table and ``summary.json`` are still written), 2 for invalid arguments, unusable data or an
output that cannot or may not be written (nothing has been sampled then). Set the environment
variable ``PYRO_SGMCMC_DEBUG=1`` to print the traceback of a method that fails.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..analysis import _arviz
from ..data.datasets import TABLE_FORMATS, dataset_task, list_datasets
from ..dynamics.sgld import INTEGRATORS
from .compare import (
    ACTIVATIONS,
    MANIFEST_NAME,
    METHODS,
    NOISES,
    PRIORS,
    TASKS,
    CompareConfig,
    ComparisonResults,
    load_data,
    run_comparison,
    run_method,
    sample_to_file,
    torch_threads,
)
from .compare_jobs import default_jobs

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_ALL_FAILED, EXIT_USAGE = 0, 1, 2

_DEFAULTS = {f.name: f.default for f in fields(CompareConfig)}


def _comma_list(kind: Callable[[str], Any], what: str) -> Callable[[str], tuple]:
    def parse(text: str) -> tuple:
        items = [item.strip() for item in text.split(",")]
        if not any(items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        if not all(items):  # "8,,8" or "8,": a typo, not a shorter list
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty entry in {text!r}")
        try:
            return tuple(kind(item) for item in items)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from error

    return parse


class _Joined(argparse.Action):
    """The items of an option given apart (``sghmc svi``), comma-separated (``sghmc,svi``) or
    both, as one tuple."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, tuple(item for value in values for item in value))


def _hidden(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return _comma_list(int, "integers such as 16,16")(text)


def _default(name: str) -> str:
    value = _DEFAULTS[name]
    if name == "dataset" and value is None:
        return "sinusoid"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return str(value)


def _path(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string")
        return text

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pyro-sgmcmc``."""
    parser = argparse.ArgumentParser(
        prog="pyro-sgmcmc",
        description="Stochastic-gradient MCMC for Bayesian neural networks in Pyro.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    commands.add_parser("datasets", help="list the built-in data sets")
    _add_compare_parser(commands)
    _add_sample_parser(commands)
    return parser


def _add_compare_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``compare`` sub-command and its options to ``commands``."""
    compare = commands.add_parser(
        "compare",
        help="compare NUTS, SGHMC, SGLD, pSGLD and SVI on one data set",
        description=(
            "Fit one Bayesian MLP with several inference methods and compare wall time, test "
            "metrics and convergence. Exit status: 0 if at least one method succeeded, 1 if all "
            "failed, 2 for invalid arguments or unusable inputs. Defaults: the sinusoid toy "
            "with a small net and all methods, in about two and a half minutes on two cores."
        ),
    )
    compare.set_defaults(subparser=compare)
    add = compare.add_argument
    _add_data_options(compare)
    add(
        "--methods",
        type=_comma_list(str, "method names"),
        nargs="+",
        action=_Joined,
        default=argparse.SUPPRESS,
        help=f"a subset of {','.join(METHODS)}, comma- or space-separated (default: all)",
    )
    add("--chains", type=int, default=argparse.SUPPRESS, help=f"default {_default('chains')}")
    add("--seed", type=int, default=argparse.SUPPRESS, help=f"default {_default('seed')}")
    add(
        "--out",
        type=_path("a directory"),
        default=argparse.SUPPRESS,
        metavar="DIR",
        help=f"output directory (default {_default('out')}); it must be new, empty, or written by "
        f"an earlier run (it then holds {MANIFEST_NAME}), whose files are replaced",
    )
    add(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --out that pyro-sgmcmc did not write (files named like "
        "its outputs are replaced, others left in place)",
    )
    add("--no-output", action="store_true", help="write no files, only print the table")
    add(
        "--time-budget",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="skip the methods that would start after this many seconds",
    )
    add(
        "--jobs",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="methods run at once, each in its own process with --threads threads (default: "
        "one per usable core, at most one per method; 1 runs them in turn, with progress bars)",
    )
    _add_fit_options(compare)
    display = compare.add_argument_group("display")
    display.add_argument("--no-progress", action="store_true", help="hide progress bars")
    display.add_argument("--no-figures", action="store_true", help="write no PNG figures")
    display.add_argument(
        "--quiet", action="store_true",
        help="no progress lines or bars: print the results only (table, status and notes)",
    )  # fmt: skip


def _add_sample_parser(commands: argparse._SubParsersAction) -> None:
    """Add the ``sample`` sub-command and its options to ``commands``."""
    sample = commands.add_parser(
        "sample",
        help="run one method and write its InferenceData (netCDF)",
        description=(
            "Fit the Bayesian MLP of `compare` with one method and write its ArviZ "
            "InferenceData (posterior, log-likelihood, observed data, test predictions) to a "
            "netCDF file; print its test metrics and convergence. Exit status: 0 on success, "
            "1 if the method failed, 2 for invalid arguments or unusable inputs."
        ),
    )
    sample.set_defaults(subparser=sample)
    sample.add_argument(
        "method", choices=METHODS, metavar="METHOD", help=f"one of {', '.join(METHODS)}"
    )
    _add_data_options(sample)
    sample.add_argument(
        "--output",
        "-o",
        type=_path("a netCDF file name"),
        metavar="FILE.nc",
        help="the netCDF file to write (default: METHOD.nc)",
    )
    sample.add_argument("--overwrite", action="store_true", help="replace an existing FILE.nc")
    sample.add_argument(
        "--chains", type=int, default=argparse.SUPPRESS, help=f"default {_default('chains')}"
    )
    sample.add_argument(
        "--seed", type=int, default=argparse.SUPPRESS, help=f"default {_default('seed')}"
    )
    sample.add_argument(
        "--distributed",
        choices=("data", "chains"),
        default=None,
        help="under torchrun (e.g. `torchrun --nproc-per-node=2 -m pyro_sgmcmc sample sghmc "
        "--distributed data`): split every minibatch over the ranks (data) or share the chains "
        "among them (chains); rank 0 writes FILE.nc. SG-MCMC methods only",
    )
    _add_fit_options(sample)
    display = sample.add_argument_group("display")
    display.add_argument("--no-progress", action="store_true", help="hide progress bars")
    display.add_argument(
        "--quiet", action="store_true",
        help="no progress lines or bars: print the result only (row, status and notes)",
    )  # fmt: skip


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data (a built-in set, or your own table)")
    group.add_argument(
        "--dataset",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help=f"one of: {', '.join(list_datasets())} (default: {_default('dataset')})",
    )
    group.add_argument(
        "--data",
        type=_path("a file name"),
        default=argparse.SUPPRESS,
        metavar="FILE",
        help=f"your own table instead of --dataset: {', '.join(TABLE_FORMATS)} (Parquet needs "
        "pandas and pyarrow); every column but --target is a numeric feature",
    )
    group.add_argument(
        "--target",
        default=argparse.SUPPRESS,
        metavar="COLUMN",
        help="the column of --data to predict",
    )
    group.add_argument(
        "--task",
        choices=TASKS,
        default=argparse.SUPPRESS,
        help="task of --data (default: inferred; text or integer labels with at most 20 "
        "distinct values are classes)",
    )
    group.add_argument(
        "--test-fraction",
        type=float,
        default=argparse.SUPPRESS,
        help=f"held-out share (default {_default('test_fraction')})",
    )
    group.add_argument(
        "--max-train",
        type=int,
        default=argparse.SUPPRESS,
        help="use a seeded subset of at most this many training rows",
    )
    group.add_argument(
        "--max-test", type=int, default=argparse.SUPPRESS, help="use at most this many test rows"
    )
    group.add_argument(
        "--data-dir", default=argparse.SUPPRESS, help="directory of the Fashion-MNIST IDX files"
    )


def _add_fit_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument(
        "--hidden",
        type=_hidden,
        default=argparse.SUPPRESS,
        metavar="N1,N2",
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

    sampling = parser.add_argument_group("sampling")
    options: Sequence[tuple[str, str, type, str]] = (
        ("--num-samples", "num_samples", int, "kept draws per chain (SG-MCMC; SVI draws per fit)"),
        ("--warmup", "warmup", int, "warm-up draws per chain (SG-MCMC)"),
        ("--nuts-num-samples", "nuts_num_samples", int, "NUTS draws per chain"),
        ("--nuts-warmup", "nuts_warmup", int, "NUTS warm-up draws per chain"),
        ("--max-tree-depth", "max_tree_depth", int, "NUTS maximum tree depth"),
        ("--nuts-target-accept", "nuts_target_accept", float, "NUTS target acceptance"),
        ("--nuts-init-steps", "nuts_init_steps", int, "Adam steps to each NUTS chain's start"),
        ("--sgld-lr", "sgld_learning_rate", float, "SGLD per-datum learning rate (step = lr/N)"),
        ("--sghmc-lr", "sghmc_learning_rate", float, "SGHMC per-datum learning rate"),
        ("--psgld-lr", "psgld_learning_rate", float, "pSGLD per-datum learning rate"),
        ("--friction", "friction", float, "SGHMC friction in (0, 1]"),
        ("--batch-size", "batch_size", int, "minibatch size (capped at N)"),
        ("--steps-per-sample", "num_steps_per_sample", int, "gradient steps per kept draw"),
        (
            "--target-ess",
            "target_ess",
            _optional_number,
            "SG-MCMC: draw in rounds until "
            "converged with this total ESS; 'none': num-samples draws only",
        ),
        (
            "--max-seconds",
            "max_seconds",
            _optional_number,
            "SG-MCMC: seconds per method, warm-up included, after which no round "
            "starts ('none': no limit)",
        ),
        ("--svi-steps", "svi_steps", int, "Adam steps per SVI fit"),
        ("--svi-lr", "svi_learning_rate", float, "SVI Adam learning rate"),
        ("--threads", "threads", int, "torch intra-op threads"),
    )
    for flag, dest, kind, text in options:
        sampling.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"{text} (default {_describe_default(dest)})",
        )
    _add_integrator_option(sampling)


def _add_integrator_option(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--integrator",
        "--sgld-integrator",
        dest="integrator",
        choices=INTEGRATORS,
        default=argparse.SUPPRESS,
        help="the SGLD and pSGLD rows' integrator: Leimkuhler and Matthews' (exact on "
        "Gaussians, larger steps) or Welling and Teh's Euler step "
        f"(default {_default('integrator')})",
    )


def _describe_default(dest: str) -> str:
    if dest.endswith("_learning_rate") and dest != "svi_learning_rate":
        return "none: the adaptive warm-up chooses the step size"
    if dest == "num_steps_per_sample":
        return "none: each chain's warm-up chooses it from its autocorrelation"
    if dest == "friction":
        return "none: the kernel's default"
    return _default(dest)


def _optional_number(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        return float(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from error


def _config(args: argparse.Namespace, **overrides: Any) -> CompareConfig:
    names = {f.name for f in fields(CompareConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if getattr(args, "no_output", False):
        values["out"] = None
    values["progress"] = not (args.no_progress or args.quiet)
    values["figures"] = not getattr(args, "no_figures", False)
    values.update(overrides)
    try:
        return CompareConfig(**values)
    except (ValueError, TypeError) as error:
        args.subparser.error(_in_flags(str(error), args.subparser))
        raise  # pragma: no cover (error() exits)


def _in_flags(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` (the configuration's, in Python's terms) with the command's flags for its
    argument names: ``batch_size must be ...`` as ``--batch-size must be ...`` and
    ``task='classification'`` as ``--task classification``."""
    for dest, flag in _flags(parser).items():
        name = re.escape(dest)
        message = re.sub(rf"\b{name}=(['\"]?)([^'\",;) ]*)\1", rf"{flag} \2", message)
        if "_" in dest:  # an identifier, not a word of the text
            message = re.sub(rf"(?<![-\w]){name}\b", flag, message)
        else:  # a word: only as the subject of the message
            message = re.sub(rf"^{name}(?=:| must )", flag, message)
    # a message that gave both forms, ``overwrite=True (--overwrite)``, now says it twice
    message = re.sub(r"(--[\w-]+(?: [^\s,;()]+)?) \((?:\1|\1 True)\)", r"\1", message)
    return re.sub(r"\((--[^,()]+), \1\)", r"(\1)", message)


#: The options that set one method's settings, and those methods: ``sample`` with another
#: method ignores them, and says so.
METHOD_OPTIONS = {
    "sgld_learning_rate": ("sgld",),
    "sghmc_learning_rate": ("sghmc",),
    "psgld_learning_rate": ("psgld",),
    "friction": ("sghmc",),
    "integrator": ("sgld", "psgld"),
    "nuts_num_samples": ("nuts",),
    "nuts_warmup": ("nuts",),
    "max_tree_depth": ("nuts",),
    "nuts_target_accept": ("nuts",),
    "nuts_init_steps": ("nuts",),
    "svi_steps": ("svi",),
    "svi_learning_rate": ("svi",),
}


def _flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's first long flag, by the name of the value it sets."""
    return {
        action.dest: next(f for f in action.option_strings if f.startswith("--"))
        for action in parser._actions
        if any(f.startswith("--") for f in action.option_strings)
        and action.dest not in ("help", argparse.SUPPRESS)
    }


def _ignored_options(args: argparse.Namespace) -> list[str]:
    """The flags given to ``sample`` that set another method's settings than the one it runs."""
    flags = _flags(args.subparser)
    return [
        f"{flags.get(dest, dest)} (applies to {' and '.join(methods)})"
        for dest, methods in METHOD_OPTIONS.items()
        if dest in vars(args) and args.method not in methods
    ]


def _logger(args: argparse.Namespace) -> Callable[[str], None] | None:
    return None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def _compare(args: argparse.Namespace) -> int:
    config = _config(args)
    if "jobs" not in vars(args):
        config = replace(config, jobs=default_jobs(config))
    try:
        results = run_comparison(config, log=_logger(args))
    except (OSError, ImportError, ValueError) as error:
        # raised before any sampling: unusable output directory, data or optional package
        print(f"pyro-sgmcmc compare: error: {_in_flags(str(error), args.subparser)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    print()
    print(
        f"{results.dataset} ({results.task}): {results.num_train} train / "
        f"{results.num_test} test rows, total {results.total_time:.1f} s (wall [s]: each "
        "method's inference; its export, predictions and verdict: on its line below)"
    )
    print(results.table())
    print(f"  {results.criterion()}")
    for line in results.messages():
        print(f"  {line}")
    if config.out is not None:
        files = results.files + [name for method in results.methods for name in method.files]
        print(f"results written to {config.out}/ ({_written(files)})")
    if results.kept_files:  # also with --quiet: the user's own files
        print(results.kept_files_line())
    if results.all_failed:
        print("every method failed", file=sys.stderr)
        return EXIT_ALL_FAILED
    return EXIT_OK


def _written(files: Sequence[str]) -> str:
    """``"summary.json, summary.md, *.nc"`` and ``", *.png"`` where figures were written."""
    suffixes = {Path(name).suffix for name in files}
    kinds = ["summary.json", "summary.md"] + [
        f"*{suffix}" for suffix in (".nc", ".png") if suffix in suffixes
    ]
    return ", ".join(kinds)


def _sample(args: argparse.Namespace) -> int:
    ignored = _ignored_options(args)
    if ignored:
        them = "them" if len(ignored) > 1 else "it"
        print(f"pyro-sgmcmc sample: warning: {', '.join(ignored)} ignored: {args.method} does "
              f"not use {them}", file=sys.stderr)  # fmt: skip
    rank = 0
    if args.distributed is not None:
        from ..engine.distributed import init_distributed, world

        if args.method not in ("sgld", "sghmc", "psgld"):
            args.subparser.error("--distributed runs the SG-MCMC methods sgld, sghmc and psgld")
        try:
            init_distributed()
        except (RuntimeError, ValueError) as error:
            print(f"pyro-sgmcmc sample: error: {error}", file=sys.stderr)
            return EXIT_USAGE
        rank = world()[0]
    config = _config(args, methods=(args.method,), out=None, figures=False,
                     distributed=args.distributed)  # fmt: skip
    if rank != 0:  # the same run as rank 0's; rank 0 reports it and writes the file
        with torch_threads(config.threads):
            outcome = run_method(config, load_data(config), args.method)
        return EXIT_OK if outcome.result.ok else EXIT_ALL_FAILED
    output = args.output or f"{args.method}.nc"
    try:
        outcome = sample_to_file(
            config, args.method, output, overwrite=args.overwrite, log=_logger(args)
        )
    except (OSError, ImportError, ValueError) as error:
        print(f"pyro-sgmcmc sample: error: {_in_flags(str(error), args.subparser)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    result, data = outcome.result, outcome.data
    row = ComparisonResults(config, data.name, data.task, data.num_train, data.num_test, [result])
    print()
    print(f"{data.name} ({data.task}): {data.num_train} train / {data.num_test} test rows")
    print(row.table())
    print(f"  {row.criterion()}")
    if result.message:
        print(f"  {result.method}: {result.message}")
    if not result.ok:
        return EXIT_ALL_FAILED
    kind = "xarray.DataTree" if _arviz.ARVIZ_1 else "arviz.InferenceData"
    print(f"{kind} written to {output} (netCDF)")
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
    with _warnings_without_source():
        return _sample(args) if args.command == "sample" else _compare(args)


@contextlib.contextmanager
def _warnings_without_source() -> Iterator[None]:
    """Warnings printed as ``Category: message``: the file and line that Python adds would
    point into this package (or the console script), which says nothing to a command's user."""
    previous = warnings.formatwarning
    warnings.formatwarning = lambda message, category, *_args, **_kwargs: (
        f"{category.__name__}: {message}\n"
    )
    try:
        yield
    finally:
        warnings.formatwarning = previous


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
