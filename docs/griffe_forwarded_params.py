"""A griffe extension that documents the options a class passes on to its base class.

The kernels (``SGLD``, ``SGHMC``, ...) take most of their options through ``**kwargs`` and hand
them to ``StochasticGradientKernel.__init__``, which declares them with their types and
defaults. The subclass signature alone, ``SGLD(model, step_size=None, **kwargs)``, would leave
mkdocstrings with no type and no default for the options the docstring documents: it would
call them "required". This extension gives each class the signature that really receives its
arguments, from the code itself and without retyping anything:

* a parameter the class's docstring documents but its ``__init__`` only receives through
  ``**kwargs`` is taken, with its annotation and default, from the nearest base class whose
  ``__init__`` declares it, and inserted before ``**kwargs`` (keyword-only, the only way
  ``**kwargs`` can receive it);
* a parameter the subclass declares without an annotation (``model``, ``step_size``) takes the
  base class's annotation; its default stays the subclass's own;
* ``**kwargs`` stays in the signature while the base class still accepts parameters that are
  neither declared nor documented (``options``) or when the docstring documents ``**kwargs``;
* an annotation that is a module-level type alias of the package with no docstring of its own
  (``StepSizeArgument``, ``TensorDict``) is replaced by the alias's value, which no page would
  otherwise show -- in every signature of the package, so that the base class and its
  subclasses read the same.

Parameters come from a base class only into an ``__init__`` whose source hands ``**kwargs``
on to ``super().__init__``. The docstring parser of mkdocstrings then finds types and defaults
in the signature, as for any other parameter.

The extension also drops the placeholder defaults griffe gives ``*args`` (``()``) and
``**kwargs`` (``{}``), which the parameter sections would show as ``DEFAULT: {}``: they are no
default a caller could rely on (the ``spacy`` section style shows no default for them instead).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from griffe import (
    Attribute,
    Class,
    Expr,
    ExprName,
    Extension,
    Function,
    Module,
    Object,
    Parameter,
    ParameterKind,
    Parameters,
    parse_numpy,
)

_VARIADIC = (ParameterKind.var_positional, ParameterKind.var_keyword)


def _documented_parameters(*objects: Object) -> set[str]:
    """Names (without stars) in the numpy ``Parameters`` sections of the objects' docstrings."""
    names: set[str] = set()
    for obj in objects:
        if obj.docstring is None:
            continue
        for section in parse_numpy(obj.docstring, warnings=False):
            if section.kind.value == "parameters":
                names.update(parameter.name.lstrip("*") for parameter in section.value)
    return names


def _expand_alias(annotation: Any) -> Any:
    """The value of an undocumented module-level type alias of the package, else ``annotation``."""
    if not isinstance(annotation, ExprName) or not isinstance(annotation.parent, Object):
        return annotation
    try:
        target = annotation.parent.modules_collection.get_member(annotation.canonical_path)
    except Exception:  # not loaded (another package) or not resolvable: keep the name
        return annotation
    if target.is_alias:
        return annotation
    if (
        isinstance(target, Attribute)
        and isinstance(target.parent, Module)
        and target.docstring is None
        and isinstance(target.value, Expr)
        and target.name[:1].isupper()
    ):
        return target.value
    return annotation


def _expand_aliases(annotation: Any) -> Any:
    """``annotation`` with each name in it expanded by :func:`_expand_alias`."""
    if isinstance(annotation, ExprName):
        return _expand_alias(annotation)
    if isinstance(annotation, Expr):
        for field in dataclasses.fields(annotation):
            value = getattr(annotation, field.name)
            if isinstance(value, Expr):
                setattr(annotation, field.name, _expand_aliases(value))
            elif isinstance(value, list):
                setattr(annotation, field.name, [_expand_aliases(item) for item in value])
    return annotation


def _receiving_init(cls: Class) -> Function | None:
    """``__init__`` of the nearest base class that defines one (the one ``super()`` calls)."""
    for base in cls.mro():
        init = base.members.get("__init__")
        if init is not None and not init.is_alias and isinstance(init, Function):
            return init
    return None


def _forward(cls: Class) -> None:
    init = cls.members.get("__init__")
    if init is None or init.is_alias or not isinstance(init, Function):
        return
    kwargs = next((p for p in init.parameters if p.kind is ParameterKind.var_keyword), None)
    # Only an __init__ that hands its **kwargs on to the base class's.
    source = init.source
    if kwargs is None or f"**{kwargs.name}" not in source or "super().__init__(" not in source:
        return
    base_init = _receiving_init(cls)
    if base_init is None:
        return
    own = {parameter.name for parameter in init.parameters}
    # Subclass parameters without an annotation take the one of the parameter they pass on.
    for parameter in init.parameters:
        if parameter.annotation is None and parameter.name in base_init.parameters:
            base_parameter = base_init.parameters[parameter.name]
            if base_parameter.kind not in _VARIADIC:
                parameter.annotation = _expand_alias(base_parameter.annotation)
    # Documented parameters that reach the base class through **kwargs join the signature.
    documented = _documented_parameters(cls, init)
    inserted = []
    remaining = []
    for base_parameter in base_init.parameters:
        if base_parameter.name in own or base_parameter.name == "self":
            continue
        if base_parameter.kind in _VARIADIC:
            remaining.append(base_parameter)
        elif base_parameter.name in documented:
            inserted.append(
                Parameter(
                    base_parameter.name,
                    annotation=_expand_alias(base_parameter.annotation),
                    kind=ParameterKind.keyword_only,
                    default=copy.copy(base_parameter.default),
                    docstring=base_parameter.docstring,
                )
            )
        else:
            remaining.append(base_parameter)
    if not inserted:
        return
    parameters = list(init.parameters)
    position = parameters.index(kwargs)
    keep_kwargs = bool(remaining) or kwargs.name in documented
    parameters[position : position + 1] = inserted + ([kwargs] if keep_kwargs else [])
    init.parameters = Parameters(*parameters)


def _objects(obj: Object):
    for member in obj.members.values():
        if member.is_alias:
            continue
        yield member
        if isinstance(member, (Module, Class)):
            yield from _objects(member)


class ForwardedParameters(Extension):
    """Give every class of the package the parameters its ``**kwargs`` really receives."""

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        # After the whole package is loaded, so that base classes in other modules resolve.
        for obj in list(_objects(pkg)):
            if isinstance(obj, Class):
                _forward(obj)
            elif isinstance(obj, Attribute):
                obj.annotation = _expand_aliases(obj.annotation)
            elif isinstance(obj, Function):
                obj.returns = _expand_aliases(obj.returns)
                for parameter in obj.parameters:
                    parameter.annotation = _expand_aliases(parameter.annotation)
                    if parameter.kind in _VARIADIC and parameter.default in ("()", "{}"):
                        parameter.default = None
