r"""Replay a potential's value and gradient from one recorded graph of tensor operations.

Evaluating a Pyro model at given latent values runs much Python for little arithmetic:
``PyroModule`` attribute look-ups, the effect-handler stack, distribution objects, and the
autograd engine walking the backward graph. For a model whose computation depends on its latent
values and data only through tensor operations, that Python issues the same operations at every
call. :class:`CapturedGraph` records them once -- forward and backward pass together -- with
``torch.fx``'s ``make_fx`` on fake tensors (shapes and dtypes only, no arithmetic), and replays
the recorded graph afterwards: the same operations in the same order, hence the same numbers,
without the Python around them. (NumPyro gets this from ``jax.jit``, with the same contract.)

A recorded graph is then simplified (:mod:`.graph_simplify`): constants folded, no-ops such
as ``x * 1`` or a view to the same shape removed, repeated operations merged -- about half the
operations of a Pyro model's minibatch gradient, with the same bits. One rewrite changes how,
not what, a recorded graph computes: a batched matrix-vector product
``bmm(A, v)`` (``A`` of shape ``(C, M, K)``, ``v`` of shape ``(C, K, 1)``, e.g. ``x @ w`` of a
linear predictor or a network's output layer for several chains, and its backward pass) is
computed as the transpose of ``bmm(v^T, A^T)``, which PyTorch's CPU kernels run two to eight
times faster for more than one chain. Each such product is rewritten only where it gives the
same bits as the product it replaces on the recording call (``_with_row_vector_products``).

On the CPU a recorded graph is then handed to TorchScript's interpreter (``torch.jit.trace`` of
the graph), which runs the same operations from C++ instead of one Python call each: two to
three times faster for small models (a minibatch gradient of Pyro's tutorial regression, about
130 operations, 0.6 ms instead of 1.5 ms), with the same numbers, which are checked bit for bit
against the graph's on the recording call before the interpreter is used. TorchScript is
deprecated in PyTorch: where it is missing, fails, or computes anything different, the graph
itself is replayed, as on other devices.

One graph is recorded per argument signature (shapes, dtypes and devices: a minibatch, a
full-data chunk, another number of chains), at the signature's second call: the first runs the
eager function, so a signature met once (the last, shorter chunk of a pass over the data, a
pass made once) costs one eager evaluation (milliseconds) instead of a recording (0.3-0.4 s).

A model that decides something in Python from a latent *value* (``if float(mu) > 0: ...``)
cannot be recorded on fake tensors: recording fails, the caller stays on its eager path, and
nothing else changes. What a recording cannot see is
Python state that changes between calls without passing through the model's arguments or latent
values (e.g. a global flag read by the model); such a model should use ``potential="trace"``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .graph_simplify import simplified

__all__ = ["CapturedGraph"]

TensorDict = dict[str, torch.Tensor]
ValueAndGrad = Callable[
    [torch.Tensor, Mapping[str, torch.Tensor], torch.Tensor | None],
    tuple[torch.Tensor, torch.Tensor],
]


class CapturedGraph:
    """``(flat, fixed, rows) -> (value, grad)`` of an eager function, replayed from graphs.

    Parameters
    ----------
    function:
        The eager computation to record: ``(C, D)`` positions, the fixed sites' ``(C, ...)``
        values and the ``(C, B)`` rows (or ``None``) to the ``(C,)`` potentials and ``(C, D)``
        gradients.
    compile:
        Compile each recorded graph with TorchInductor (seconds per graph the first time; a
        small model's step then costs tens of microseconds instead of a millisecond). The
        compiled kernels may round differently from the recorded operations.

    Attributes
    ----------
    failure:
        Why recording failed (``None`` while it has not): the caller then evaluates eagerly.
    """

    def __init__(self, function: ValueAndGrad, compile: bool = False) -> None:
        self.function = function
        self.graphs: dict[tuple, Callable[..., Any]] = {}
        self.seen: set[tuple] = set()  # signatures called once, not yet recorded
        self.failure: str | None = None
        self.compile = compile
        self.compile_failure: str | None = None

    def __call__(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The recorded graph's result (the eager function's at a signature's first call), or
        ``None`` if this call's graph cannot be recorded."""
        if self.failure is not None:
            return None
        names = tuple(sorted(fixed))
        key = (_signature(flat), _signature(rows), names, *(_signature(fixed[n]) for n in names))
        graph = self.graphs.get(key)
        if graph is None and key not in self.seen:
            self.seen.add(key)
            return self.function(flat, fixed, rows)
        if graph is None:
            graph = self._record(flat, fixed, rows, names)
            if graph is None:
                return None
            self.graphs[key] = graph
        inputs = (flat, *(fixed[n] for n in names))
        # the recording holds the backward pass as plain operations: no autograd here, which a
        # constant that requires grad (a model's pyro.param) would otherwise record, step after
        # step, into one graph that grows with the chain (TorchScript's replay records it even
        # under no_grad: hence the detach)
        with torch.no_grad():
            value, grad = graph(*inputs) if rows is None else graph(rows, *inputs)
        return value.detach(), grad.detach()

    def _compiled(self, graph: torch.fx.GraphModule, inputs: tuple) -> Callable[..., Any]:
        """``graph`` compiled by TorchInductor (generated C++ or Triton kernels: the recorded
        operations fused, without a Python call per operation), or ``graph`` itself where
        compilation fails (the reason is kept in :attr:`compile_failure`)."""
        try:
            from torch._inductor.compile_fx import compile_fx

            compiled = compile_fx(graph, list(inputs))
            compiled(*inputs)  # the first call finishes the compilation: fail here, not later
        except Exception as error:  # no C++ compiler, an unsupported operation, ...
            self.compile_failure = f"{type(error).__name__}: {_first_line(error)}"
            return graph
        return compiled

    def _record(
        self, flat: torch.Tensor, fixed: Mapping[str, torch.Tensor], rows, names: tuple[str, ...]
    ) -> torch.fx.GraphModule | None:
        from torch.fx.experimental.proxy_tensor import make_fx

        def with_rows(rows, flat, *values):
            return self.function(flat, dict(zip(names, values, strict=True)), rows)

        def without_rows(flat, *values):
            return self.function(flat, dict(zip(names, values, strict=True)), None)

        inputs = (flat, *(fixed[n].detach() for n in names))
        if rows is not None:
            inputs = (rows, *inputs)
        traced = without_rows if rows is None else with_rows
        try:
            graph = make_fx(traced, tracing_mode="fake", _allow_non_fake_inputs=True)(*inputs)
        except Exception as error:
            self.failure = f"{type(error).__name__}: {_first_line(error)}"
            return None
        graph = simplified(_with_row_vector_products(graph, inputs), inputs, _identical)
        return self._compiled(graph, inputs) if self.compile else _interpreted(graph, inputs)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its graphs (TorchScript and compiled graphs do not pickle); a copy
        records them again at its first calls."""
        return {**self.__dict__, "graphs": {}}


def _interpreted(graph: torch.fx.GraphModule, inputs: tuple) -> Callable[..., Any]:
    """``graph`` traced into TorchScript, whose interpreter runs the recorded operations from C++,
    or ``graph`` itself off the CPU, where tracing fails, or where the traced graph's results
    differ in any bit from the graph's on ``inputs`` (three calls, as TorchScript's profiling
    executor specialises the graph after its first calls)."""
    if not _on_cpu(inputs):
        return graph
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecation notices (also on import); tracer's
            traced = torch.jit.trace(graph, inputs, check_trace=False)
            expected = graph(*inputs)
            replays = [traced(*inputs) for _ in range(3)]
    except Exception:  # an operation TorchScript cannot hold, or no TorchScript at all
        return graph
    if not all(_identical(expected, replay) for replay in replays):
        return graph
    return traced


def _on_cpu(inputs: tuple) -> bool:
    """Whether every tensor among ``inputs`` is on the CPU."""
    return all(t.device.type == "cpu" for t in inputs if isinstance(t, torch.Tensor))


def _identical(first: Any, second: Any) -> bool:
    """Whether two results (tensors, or tuples and lists of them) are equal in every bit."""
    if isinstance(first, torch.Tensor):
        return isinstance(second, torch.Tensor) and torch.equal(first, second)
    if isinstance(first, (tuple, list)) and isinstance(second, (tuple, list)):
        return len(first) == len(second) and all(map(_identical, first, second))
    return False


def _with_row_vector_products(graph: torch.fx.GraphModule, inputs: tuple) -> torch.fx.GraphModule:
    r"""``graph`` with each batched matrix-vector product :math:`A v`
    (:func:`_is_slow_matrix_vector`) computed as :math:`(v^\top A^\top)^\top` where the inputs
    are on the CPU and that product, rewritten alone, gives the same bits on ``inputs``.

    ``torch.bmm`` on the CPU multiplies a batch of matrices by a batch of column vectors several
    times slower than a batch of row vectors by the same matrices (e.g. 35 us against 14 us for
    four chains' ``(500, 20) @ (20, 1)``, 50 us against 6 us for the gradient's ``(20, 500) @
    (500, 1)``). The two usually add the same products in the same order; where they do not
    (e.g. a column vector that is a transposed view, as ``nn.Linear``'s weight), the rewritten
    product would round differently from the eager computation it stands in for, and that
    product is left as recorded.
    """
    if not _on_cpu(inputs):
        return graph  # measured on the CPU only
    names = [node.name for node in graph.graph.nodes if _is_slow_matrix_vector(node)]
    expected = graph(*inputs) if names else None
    for name in names:
        candidate = _with_row_vector_product(graph, name)
        try:
            same = _identical(expected, candidate(*inputs))
        except Exception:  # a later operation that needs the original's memory layout
            same = False
        if same:
            graph = candidate
    return graph


def _with_row_vector_product(graph: torch.fx.GraphModule, name: str) -> torch.fx.GraphModule:
    """A copy of ``graph`` (sharing its constants) whose ``bmm`` node ``name`` is computed as
    the transpose of row vectors times the transposed matrices."""
    rewritten = torch.fx.GraphModule(graph, copy.deepcopy(graph.graph))
    node = next(node for node in rewritten.graph.nodes if node.name == name)
    matrix, vector = node.args
    aten = torch.ops.aten
    with rewritten.graph.inserting_before(node):
        rows = rewritten.graph.call_function(aten.transpose.int, (vector, 1, 2))
        columns = rewritten.graph.call_function(aten.transpose.int, (matrix, 1, 2))
        product = rewritten.graph.call_function(aten.bmm.default, (rows, columns))
        result = rewritten.graph.call_function(aten.transpose.int, (product, 1, 2))
    node.replace_all_uses_with(result)
    rewritten.graph.erase_node(node)
    rewritten.recompile()
    return rewritten


#: Below this many matrix entries in all chains the three extra transposes cost about what the
#: faster product saves.
ROW_VECTOR_MIN_ENTRIES = 8192


def _is_slow_matrix_vector(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a ``bmm`` of ``C > 1`` matrices of shape ``(M, K)``, with at least
    :data:`ROW_VECTOR_MIN_ENTRIES` entries in all, by ``(K, 1)`` column vectors."""
    if node.op != "call_function" or node.target is not torch.ops.aten.bmm.default:
        return False
    shapes = [
        getattr(arg.meta.get("val"), "shape", None) if isinstance(arg, torch.fx.Node) else None
        for arg in node.args
    ]
    if any(shape is None or len(shape) != 3 for shape in shapes):
        return False
    (batch, rows, inner), (_, _, columns) = shapes
    return batch > 1 and columns == 1 and batch * rows * inner >= ROW_VECTOR_MIN_ENTRIES


def _signature(value: Any) -> tuple | None:
    if value is None:
        return None
    return (tuple(value.shape), value.dtype, value.device)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
