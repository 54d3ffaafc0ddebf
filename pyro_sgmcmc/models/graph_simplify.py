r"""Fewer operations in a recorded graph, with the same numbers.

A graph recorded from a Pyro model's potential (:mod:`.graph_capture`) replays every operation
the eager computation issued, and most of them are not arithmetic on the data: a prior's
constant ``log(scale) + log(2 pi) / 2``, scalars converted to tensors, a site's log-density
multiplied by a plate's scale of 1 or increased by 0, views that give a tensor back its own shape,
and the backward pass's seed gradient of ones broadcast, negated and scaled. On the CPU each
replayed operation costs one to three microseconds however small; a minibatch gradient of a
logistic regression had 151 operations, about a third of them of these kinds.

:func:`simplified` removes them without changing a bit of the results:

* **constant folding** -- an operation whose inputs are all constants of the graph (tensors held
  by it, Python numbers, or shapes known at recording) is computed once, at recording, and its
  result becomes a constant of the graph;
* **no-op removal** -- a view whose shape, strides and offset equal those of a tensor it views
  (``view`` to the same shape, an identity ``permute``, ``squeeze`` of an ``unsqueeze``) is that
  tensor; so is the value of ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0``, ``x ** 1``, ``-(-x)``
  and of a sum over dimensions of size one, where the result has ``x``'s shape, strides and
  dtype;
* **common operations merged** -- an operation repeated on the same inputs is computed once.

None of them touches a tensor that an in-place operation of the graph writes to, or any view of
it (their values depend on the order of operations), random operations, or the results the graph
returns (each stays a fresh tensor of its own, which a caller may modify). The simplified
graph's results are compared bit for bit with the recorded graph's on the recording call; where
they differ in anything, the recorded graph is kept as it was.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Node

__all__ = ["simplified"]

aten = torch.ops.aten

#: Operations that return their argument's values (``lift_fresh_copy``: a copy of a constant).
_IDENTITIES = (aten.detach.default, aten.lift_fresh_copy.default)

#: Operations whose result depends only on their argument's shape and dtype.
_SHAPE_ONLY = (aten.ones_like.default, aten.zeros_like.default, aten.full_like.default)

#: Operations that copy their argument (a copy laid out as the argument is its value).
_COPIES = (aten.clone.default, aten._to_copy.default)

#: ``_unsafe_view`` shares its argument's memory, although its schema does not say so.
_UNDECLARED_VIEWS = (aten._unsafe_view.default,)

#: A folded constant that is not a view of another is kept only up to this many elements (a
#: computation on a large data set stays in the replay rather than doubling the data's memory).
FOLD_MAX_ELEMENTS = 1 << 20

#: Operations whose result is ``x`` where their second argument is this number.
_NEUTRAL = {
    aten.mul.Tensor: 1,
    aten.mul.Scalar: 1,
    aten.div.Tensor: 1,
    aten.div.Scalar: 1,
    aten.add.Tensor: 0,
    aten.add.Scalar: 0,
    aten.sub.Tensor: 0,
    aten.sub.Scalar: 0,
    aten.pow.Tensor_Scalar: 1,
}


def simplified(
    graph: GraphModule, inputs: tuple, identical: Callable[[Any, Any], bool]
) -> GraphModule:
    """``graph`` with constants folded, no-ops removed and repeated operations merged, if its
    results on ``inputs`` are ``identical`` to the recorded graph's; else ``graph`` with only
    the copies and ``detach`` calls a replay does not need removed."""
    graph = _without_identities(graph)
    candidate = GraphModule(graph, copy.deepcopy(graph.graph))
    try:
        _record_layouts(candidate)
        _Rewriter(candidate).run()
        same = identical(graph(*inputs), candidate(*inputs))
    except Exception:  # an operation the rewrites did not foresee: keep the recording
        same = False
    return candidate if same else graph


def _without_identities(graph: GraphModule) -> GraphModule:
    """``graph`` without ``detach`` (no autograd runs in a replay), copies of constants that
    nothing modifies in place, and operations whose results are unused."""
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in _IDENTITIES:
            continue
        if node.target is not aten.detach.default and any(_writes(user) for user in node.users):
            continue
        node.replace_all_uses_with(node.args[0])
        graph.graph.erase_node(node)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    return graph


def _record_layouts(module: GraphModule) -> None:
    """Record every node's result shape, strides and dtype again (``meta["val"]``, fake
    tensors), in the fake mode of the recording: nodes added or rewired after the recording
    (:mod:`.graph_capture`'s rewrites) have none, or stale ones. (Not with ``torch.fx``'s
    ``Interpreter``: its progress bar takes a lock that deadlocks forked workers.)"""
    nodes = list(module.graph.nodes)
    recorded = [node.meta.get("val") for node in nodes if node.op == "placeholder"]
    fake_mode = next(value.fake_mode for value in recorded if hasattr(value, "fake_mode"))
    for node in nodes:
        if node.op == "get_attr":
            node.meta["val"] = fake_mode.from_tensor(_attribute(module, node.target))
    with fake_mode:
        for node in nodes:
            if node.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), _recorded_value)
                node.meta["val"] = node.target(*args, **kwargs)


def _recorded_value(node: Node) -> Any:
    return node.meta["val"]


class _Rewriter:
    """The three rewrites of :func:`simplified`, applied to one graph in place."""

    def __init__(self, module: GraphModule) -> None:
        self.module = module
        self.graph = module.graph
        self.written = _written_nodes(self.graph)
        self.constants: dict[Node, torch.Tensor] = {}
        self.folded = 0

    def run(self) -> None:
        for node in list(self.graph.nodes):
            if node.op == "get_attr" and node not in self.written:
                self.constants[node] = _attribute(self.module, node.target)
            elif node.op == "call_function" and node not in self.written and not _returned(node):
                self._fold(node) or self._drop_no_op(node)
        self._merge_repeats()
        self.graph.eliminate_dead_code()
        self.graph.lint()
        self.module.recompile()

    # ------------------------------------------------------------------------ constant folding
    def _fold(self, node: Node) -> bool:
        """Replace ``node`` by a constant if its inputs are constants; whether it did."""
        if not self._foldable(node):
            return False
        value = node.target(*self._values(node.args), **self._values(node.kwargs))
        if not isinstance(value, torch.Tensor) or not self._small_or_view(node, value):
            return False
        name = f"_folded_{self.folded}"
        self.folded += 1
        self.module.register_buffer(name, value, persistent=False)
        with self.graph.inserting_before(node):
            constant = self.graph.get_attr(name)
        constant.meta["val"] = value
        self.constants[constant] = value
        node.replace_all_uses_with(constant)
        self.graph.erase_node(node)
        return True

    def _foldable(self, node: Node) -> bool:
        name = getattr(node.target, "__name__", "")
        if _random(node) or _writes(node) or name.startswith("empty"):
            return False
        operands = node.all_input_nodes
        if node.target in _SHAPE_ONLY:
            operands = [operand for operand in operands if operand is not node.args[0]]
        return all(operand in self.constants for operand in operands)

    def _small_or_view(self, node: Node, value: torch.Tensor) -> bool:
        """Whether a folded ``value`` is small or shares a constant's memory."""
        if value.numel() <= FOLD_MAX_ELEMENTS:
            return True
        storage = value.untyped_storage().data_ptr()
        return any(
            self.constants[operand].untyped_storage().data_ptr() == storage
            for operand in node.all_input_nodes
        )

    def _values(self, structure: Any) -> Any:
        """``structure`` with constant nodes replaced by their tensors, and the argument of a
        shape-only operation by a tensor of its recorded shape and dtype."""

        def value(node: Node) -> Any:
            if node in self.constants:
                return self.constants[node]
            fake = node.meta["val"]
            return torch.empty_strided(
                fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device
            )

        return torch.fx.node.map_arg(structure, value)

    # ---------------------------------------------------------------------------- no-op removal
    def _drop_no_op(self, node: Node) -> None:
        """Replace ``node`` by the tensor it equals, if it is a no-op."""
        source = self._same_view(node) if _is_view(node) else self._same_value(node)
        if source is not None:
            node.replace_all_uses_with(source)
            self.graph.erase_node(node)

    def _same_view(self, node: Node) -> Node | None:
        """A tensor that ``node`` views with the same shape, strides and offset, if any."""
        return _same_layout_view(node, node.args[0] if node.args else None)

    def _same_value(self, node: Node) -> Node | None:
        """The tensor whose values ``node`` computes again, if any and laid out alike."""
        source = self._neutral_operand(node)
        if source is None or source in self.written or not _same_layout(node, source):
            return None
        return source

    def _neutral_operand(self, node: Node) -> Node | None:
        args = node.args
        if not args or not isinstance(args[0], Node) or args[0] in self.written:
            return None
        if node.target in _NEUTRAL and len(args) == 2 and not node.kwargs:
            if self._equals(args[1], _NEUTRAL[node.target]):
                return args[0]
        if node.target in _COPIES:
            return args[0]
        if node.target is aten.neg.default and _calls(args[0], aten.neg.default):
            return args[0].args[0]
        if node.target is aten.sum.dim_IntList and len(args) >= 2 and not node.kwargs:
            shape = args[0].meta["val"].shape
            if all(shape[dim] == 1 for dim in args[1]):
                return _same_layout_view(node, args[0])
        return None

    def _equals(self, operand: Any, number: float) -> bool:
        """Whether ``operand`` is the Python ``number`` or a constant whose every element is."""
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return operand == number
        value = self.constants.get(operand) if isinstance(operand, Node) else None
        return value is not None and value.numel() > 0 and bool((value == number).all())

    # ---------------------------------------------------------------------- repeated operations
    def _merge_repeats(self) -> None:
        """Compute an operation repeated on the same inputs once."""
        seen: dict[tuple, Node] = {}
        for node in list(self.graph.nodes):
            if node.op != "call_function" or node in self.written or _random(node):
                continue
            if _returned(node):
                continue
            if _writes(node) or any(operand in self.written for operand in node.all_input_nodes):
                continue
            try:
                key = (node.target, _hashable(node.args), _hashable(node.kwargs))
                earlier = seen.setdefault(key, node)
            except TypeError:  # an argument that cannot be compared
                continue
            if earlier is not node:
                node.replace_all_uses_with(earlier)
                self.graph.erase_node(node)


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for name in target.split("."):
        value = getattr(value, name)
    return value


def _schema(node: Node) -> Any:
    return getattr(node.target, "_schema", None)


def _writes(node: Node) -> bool:
    """Whether ``node`` writes to any of its arguments (an in-place or ``out=`` operation)."""
    schema = _schema(node)
    if schema is None:
        return node.op == "call_function" and node.target is not operator.getitem
    return any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments)


def _is_view(node: Node) -> bool:
    """Whether ``node``'s result shares its first argument's memory (a view)."""
    if node.target is operator.getitem or node.target in _UNDECLARED_VIEWS:
        return True
    schema = _schema(node)
    if schema is None or not schema.returns or _writes(node):
        return False
    return schema.returns[0].alias_info is not None


def _returns_alias(node: Node) -> bool:
    """Whether ``node`` returns (a view of) an argument, as in-place operations do."""
    schema = _schema(node)
    return schema is not None and bool(schema.returns) and schema.returns[0].alias_info is not None


def _returned(node: Node) -> bool:
    """Whether the graph returns ``node``'s result: it stays a fresh tensor of its own (a
    caller may modify a result in place; it must not modify an input or a constant with it)."""
    return any(user.op == "output" for user in node.users)


def _random(node: Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


def _calls(operand: Any, target: Any) -> bool:
    return isinstance(operand, Node) and operand.op == "call_function" and operand.target is target


def _written_nodes(graph: torch.fx.Graph) -> set[Node]:
    """Every node whose memory an in-place operation may write to: the tensors written and
    everything that views them or that they view, transitively."""
    groups: dict[Node, Node] = {}

    def root(node: Node) -> Node:
        while groups.get(node, node) is not node:
            node = groups[node]
        return node

    for node in graph.nodes:
        shares = _is_view(node) or (_writes(node) and _returns_alias(node))
        if node.op == "call_function" and shares and isinstance(node.args[0], Node):
            groups[root(node)] = root(node.args[0])
    written_roots = {
        root(node.args[0])
        for node in graph.nodes
        if node.op == "call_function" and _writes(node) and node.args
        if isinstance(node.args[0], Node)
    }
    return {node for node in graph.nodes if root(node) in written_roots}


def _same_layout_view(node: Node, source: Any) -> Node | None:
    """``source``, or a tensor that it views, laid out as ``node``'s result; ``None`` if none."""
    while isinstance(source, Node):
        if _same_layout(node, source):
            return source
        if source.op != "call_function" or not _is_view(source):
            return None
        source = source.args[0]
    return None


def _same_layout(node: Node, other: Node) -> bool:
    """Whether the two nodes' recorded results have the same shape, strides, offset and dtype."""
    first, second = node.meta.get("val"), other.meta.get("val")
    if not isinstance(first, torch.Tensor) or not isinstance(second, torch.Tensor):
        return False
    return (
        first.shape == second.shape
        and first.dtype == second.dtype
        and first.device == second.device
        and first.stride() == second.stride()
        and first.storage_offset() == second.storage_offset()
    )


def _hashable(structure: Any) -> Any:
    """``structure`` (an operation's arguments) as a hashable key; nodes stand for themselves."""
    if isinstance(structure, (list, tuple)):
        return tuple(_hashable(item) for item in structure)
    if isinstance(structure, dict):
        return tuple(sorted((key, _hashable(value)) for key, value in structure.items()))
    if isinstance(structure, torch.Tensor):
        raise TypeError("a tensor argument")
    hash(structure)
    return (type(structure), structure)
