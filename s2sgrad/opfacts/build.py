"""Build `s2sgrad/opfacts/table.py` from the installed torch: `python -m s2sgrad.opfacts.build`.

A development tool, never imported by the engine (it imports torch, torchgen and yaml).
It reads what torch itself says about its operators and writes one deterministic table:

- every aten operator's overloads, from `torch._C._jit_get_all_schemas()` (out= variants
  left out), as `params -> returns` in the compact form `opfacts` parses;
- the Python names that do not call the aten operator of the same name with the same
  parameters: Python functions (`torch.nn.functional.relu`, `torch.split`) by their own
  signature and return annotation, TorchScript's `boolean_dispatch` functions
  (`max_pool2d(..., return_indices=...)`) by the flag that picks the return, and the
  tensor methods aten does not have (`x.long()`, `x.tolist()`) by calling them once;
- which operators carry no gradient: torchgen's `DONT_REQUIRE_DERIVATIVE`, the probes
  of `NOGRAD_PROBES` (`detach`, which autograd implements by hand), the outputs
  `derivatives.yaml` marks non-differentiable, the ones whose every derivative formula is
  zero, and index outputs (`max.dim`'s `indices`);
- views (`RETURNS_VIEWS_OF_INPUT`, schema alias annotations), operators that may hand
  back their input object (schema aliasing outside the true views, the
  `maybe_aliasing_or_mutating` tag, and the probes below, each checked by running it),
  composite operators that may hand back a view of any tensor argument (`einsum`,
  `dropout1d`: the probes of `SHARES_PROBES`, each checked by running it),
  random operators (the `nondeterministic_seeded` tag), pointwise ones (the tag), and
  each in-place operator's out-of-place twin.

`tests/test_opfacts.py` rebuilds the text and fails when it differs from the committed
table, so the table follows the installed torch.
"""

from __future__ import annotations

import importlib.resources
import inspect
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import yaml  # type: ignore[import-untyped]
from torchgen.packaged.autograd.gen_inplace_or_view_type import (  # type: ignore[import-untyped]
    RETURNS_VIEWS_OF_INPUT,
    VIEW_FUNCTIONS,
)
from torchgen.packaged.autograd.gen_variable_type import (  # type: ignore[import-untyped]
    DONT_REQUIRE_DERIVATIVE,
)

#: Namespaces whose Python names map to aten operators, and the aten prefix they take.
NAMESPACES: dict[str, tuple[Any, str]] = {
    "torch": (torch, ""),
    "torch.Tensor": (torch.Tensor, ""),
    "torch.nn.functional": (torch.nn.functional, ""),
    "torch.linalg": (torch.linalg, "linalg_"),
    "torch.special": (torch.special, "special_"),
    "torch.fft": (torch.fft, "fft_"),
}

#: Operators whose implementation returns its input object on some inputs although the
#: schema does not say so, each with a call that shows it (run at build time).
RETURNS_INPUT_PROBES: dict[str, Callable[[torch.Tensor], object]] = {
    "sum_to_size": lambda x: x.sum_to_size(x.shape),
    "to": lambda x: x.to(x.dtype),
    "type_as": lambda x: x.type_as(x),
    "contiguous": lambda x: x.contiguous(),
    "real": lambda x: x.real,
    "conj": lambda x: x.conj(),
    "positive": lambda x: x.positive(),
    "resolve_conj": lambda x: x.resolve_conj(),
    "resolve_neg": lambda x: x.resolve_neg(),
    "as_tensor": lambda x: torch.as_tensor(x),
    "broadcast_tensors": lambda x: torch.broadcast_tensors(x)[0],  # type: ignore[no-untyped-call]
    "flatten": lambda x: x.flatten(),
    "to_dense": lambda x: x.to_dense(),
}

#: Operators whose result may share memory with a tensor argument, not always the first,
#: although the schema does not say so: composite operators that hand back a view of an
#: operand on some inputs (`einsum('ij->ji', x)` is `x.permute(1, 0)`, `dropout1d` in
#: eval mode is its input). Each probe is run at build time and must share its input's
#: storage.
SHARES_PROBES: dict[str, Callable[[torch.Tensor], object]] = {
    "einsum": lambda x: torch.einsum("ij->ji", x),
    "meshgrid": lambda x: torch.meshgrid(x[0], indexing="ij")[0],
    "unsafe_split": lambda x: torch.unsafe_split(x, 1, 1)[0],
    "dropout1d": lambda x: torch.nn.functional.dropout1d(x, 0.5, False),
    "dropout2d": lambda x: torch.nn.functional.dropout2d(x[None, None], 0.5, False),
    "dropout3d": lambda x: torch.nn.functional.dropout3d(x[None, None], 0.5, False),
    "asarray": lambda x: torch.asarray(x),
    "type": lambda x: x.type(x.type()),
    "as_subclass": lambda x: x.as_subclass(torch.Tensor),
    "broadcast_tensors": lambda x: torch.broadcast_tensors(x[0], x)[1],  # type: ignore[no-untyped-call]
    "atleast_1d": lambda x: torch.atleast_1d(x[0], x)[1],  # type: ignore[no-untyped-call]
    "atleast_2d": lambda x: torch.atleast_2d(x[0], x)[1],  # type: ignore[no-untyped-call]
}

#: Operators whose result never carries a gradient although derivatives.yaml does not say
#: so (autograd implements them by hand), each with a call that shows it.
NOGRAD_PROBES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "detach": lambda x: x.detach(),
}


#: Operators whose schema says the result may alias an input but that always build a
#: new tensor object (a view or a copy), each with a call that shows a new object.
FRESH_PROBES: dict[str, Callable[[torch.Tensor], object]] = {
    "reshape": lambda x: x.reshape(x.shape),
    "reshape_as": lambda x: x.reshape_as(x),
    "view_as": lambda x: x.view_as(x),
    "expand_as": lambda x: x.expand_as(x),
    "detach": lambda x: x.detach(),
    "narrow": lambda x: x.narrow(0, 0, x.shape[0]),
    "movedim": lambda x: x.movedim(0, 0),
    "moveaxis": lambda x: x.moveaxis(0, 0),
    "swapaxes": lambda x: x.swapaxes(0, 0),
    "swapdims": lambda x: x.swapdims(0, 0),
    "chunk": lambda x: x.chunk(1)[0],
    "unsafe_chunk": lambda x: x.unsafe_chunk(1)[0],
    "tensor_split": lambda x: x.tensor_split(1)[0],
    "hsplit": lambda x: x.hsplit(1)[0],
    "unflatten": lambda x: x.unflatten(0, (x.shape[0],)),  # type: ignore[no-untyped-call]
    "broadcast_to": lambda x: x.broadcast_to(x.shape),
    "ravel": lambda x: x.ravel(),
    "mT": lambda x: x.mT,
    "mH": lambda x: x.mH,
    "adjoint": lambda x: x.adjoint(),
    "vsplit": lambda x: x.vsplit(1)[0],
}

#: Filled by `aten_table`: operator -> floating-point outputs without a gradient.
DETACHED: dict[str, list[int]] = {}

#: Names of schema returns that hold indices or counts: integer tensors, no gradient.
_INDEX_RETURNS = re.compile(r"indices|counts|info|pivots")

_SCALAR_CODES = {
    "int": "i",
    "SymInt": "i",
    "float": "f",
    "bool": "b",
    "number": "n",
    "Scalar": "n",
    "complex": "n",
    "str": "s",
    "NoneType": "N",
    "Tensor": "T",
}


def type_code(text: str) -> str:
    """The compact code of a TorchScript type (`List[int]` -> `i[]`)."""
    text = text.replace(" ", "")
    optional = re.fullmatch(r"Optional\[(.*)\]", text)
    if optional:
        inner = type_code(optional.group(1))
        return inner if inner.endswith("?") else inner + "?"
    listed = re.fullmatch(r"List\[(.*)\]", text)
    if listed:
        inner = type_code(listed.group(1)).rstrip("?")
        return inner + "[]" if inner in ("T", "i", "f", "b", "n", "s") else "?"
    if text in _SCALAR_CODES:
        return _SCALAR_CODES[text]
    if text in ("t", "t1", "t2", "tVal", "Any") or "[" in text:
        return "?"
    return "o"  # Device, Generator, Layout, Storage, Stream, classes...


def _schema_params(schema: Any) -> str:
    parts: list[str] = []
    keyword = False
    for arg in schema.arguments:
        if arg.kwarg_only and not keyword:
            parts.append("*")
            keyword = True
        code = type_code(str(arg.type))
        default = "=" if arg.has_default_value() else ""
        parts.append(f"{arg.name}:{code}{default}")
    return ",".join(parts)


def _schema_returns(schema: Any, nograd: list[bool] | None) -> str:
    codes = []
    for i, ret in enumerate(schema.returns):
        code = type_code(str(ret.type))
        index = bool(ret.name) and _INDEX_RETURNS.search(ret.name) is not None
        if (nograd is not None and i < len(nograd) and nograd[i]) or index:
            code += "'"
        codes.append(code)
    names = [str(ret.name) for ret in schema.returns]
    if len(codes) > 1 and all(names):  # a torch.return_types named tuple
        codes = [f"{name}:{code}" for name, code in zip(names, codes, strict=True)]
    return ",".join(codes)


def _derivatives() -> list[dict[str, Any]]:
    text = (
        importlib.resources.files("torchgen.packaged.autograd")
        .joinpath("derivatives.yaml")
        .read_text("utf-8")
    )
    entries = yaml.safe_load(text)
    assert isinstance(entries, list)
    return entries


def _zero_formula(value: object) -> bool:
    return isinstance(value, str) and (
        value.startswith("zeros_like(") or value == "non_differentiable"
    )


def _no_gradient() -> tuple[set[str], dict[str, list[bool]]]:
    """Operators whose outputs never carry a gradient, and per-overload output flags."""
    names = set(DONT_REQUIRE_DERIVATIVE)
    x = torch.randn(2, dtype=torch.float64, requires_grad=True)
    for name, probe in NOGRAD_PROBES.items():
        if probe(x).requires_grad:
            raise AssertionError(f"probe of `{name}` now carries a gradient")
        names.add(name)
    outputs: dict[str, list[bool]] = {}
    for entry in _derivatives():
        signature = str(entry["name"]).split("(")[0]
        flags = entry.get("output_differentiability")
        formulas = {
            k: v
            for k, v in entry.items()
            if k not in ("name", "dispatch", "output_differentiability")
            and not k.startswith("result")
        }
        returned = str(entry["name"]).rsplit("->", 1)[-1].strip()
        count = returned.count(",") + 1 if returned.startswith("(") else 1
        if isinstance(flags, list) and all(isinstance(f, bool) for f in flags):
            outputs[signature] = [not f for f in flags]
        elif count > 1 and any(_SINGLE_GRAD.search(str(v)) for v in formulas.values()):
            # torchgen's rule: a formula that reads `grad`, not `grads[i]`, makes the
            # first output alone differentiable (`native_layer_norm`'s mean and rstd).
            outputs[signature] = [False] + [True] * (count - 1)
        if formulas and all(_zero_formula(v) for v in formulas.values()):
            outputs[signature] = [True]
    return names, outputs


#: A derivative formula that reads the single incoming gradient (torchgen's test).
_SINGLE_GRAD = re.compile(r"(^|\W)grad($|\W)")

#: Example values for a schema argument, on the meta device: enough to call most
#: operators and read their outputs' dtypes without computing anything.
_META_ARGS: dict[str, Any] = {
    "T": lambda: torch.empty(2, 3, 4, dtype=torch.float64, device="meta"),
    "i[]": lambda: [4],
    "i": lambda: 1,
    "f": lambda: 0.5,
    "b": lambda: True,
    "n": lambda: 1.0,
}


def _floating_detached(
    schema: Any, nograd: list[bool] | None
) -> tuple[int, ...] | None:
    """The outputs torch returns without a gradient that hold floating-point values for
    floating-point inputs (statistics such as `native_layer_norm`'s mean and rstd, not
    indices), found by calling the operator on meta tensors; None when none are or the
    call cannot be made."""
    if not nograd or not any(nograd[1:]) or len(schema.returns) < 2:
        return None
    args: list[Any] = []
    for arg in schema.arguments:
        if arg.kwarg_only and arg.default_value is not None:
            break
        kind = type_code(str(arg.type))
        if kind.endswith("?"):
            args.append(None)
        elif kind in _META_ARGS:
            args.append(_META_ARGS[kind]())
        else:
            return None
    op = getattr(getattr(torch.ops.aten, schema.name[len("aten::") :]), "default", None)
    if schema.overload_name:
        name = schema.name[len("aten::") :]
        op = getattr(getattr(torch.ops.aten, name), schema.overload_name, None)
    if op is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = op(*args)
    except Exception:
        return None
    if not isinstance(found, (tuple, list)):
        return None
    floating = tuple(
        i
        for i, (out, flag) in enumerate(zip(found, nograd, strict=False))
        if flag
        and isinstance(out, torch.Tensor)
        and (out.is_floating_point() or out.is_complex())
    )
    return floating or None


def _tags(name: str, overload: str) -> set[str]:
    try:
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
    except (AttributeError, RuntimeError):
        return set()
    return {tag.name for tag in op.tags}


def aten_table() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """Overloads per aten operator, and the flags of each operator."""
    overloads: dict[str, list[str]] = {}
    flags: dict[str, set[str]] = {}
    nograd_names, nograd_outputs = _no_gradient()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name = schema.name[len("aten::") :]
        tags = _tags(name, schema.overload_name)
        if "out" in tags or any(a.is_out for a in schema.arguments):
            continue
        full = f"{name}.{schema.overload_name}" if schema.overload_name else name
        nograd = nograd_outputs.get(full)
        text = f"{schema.overload_name}|{_schema_params(schema)}->"
        text += _schema_returns(schema, nograd)
        overloads.setdefault(name, []).append(text)
        mine = flags.setdefault(name, set())
        floating = _floating_detached(schema, nograd)
        if floating is not None:
            DETACHED[name] = sorted(set(DETACHED.get(name, [])) | set(floating))
        if name in nograd_names:
            mine.add("nograd")
        if "nondeterministic_seeded" in tags:
            mine.add("random")
        if "pointwise" in tags:
            mine.add("pointwise")
        if "inplace" in tags or name.endswith("_"):
            if any(
                a.alias_info is not None and a.alias_info.is_write
                for a in schema.arguments[:1]
            ):
                mine.add("inplace")
        if "maybe_aliasing_or_mutating" in tags:
            mine.add("returns_input")
        aliased = [
            r
            for r in schema.returns
            if r.alias_info is not None and not r.alias_info.is_write
        ]
        if aliased:
            mine.add("view")
            if name not in VIEW_FUNCTIONS and name not in FRESH_PROBES:
                mine.add("returns_input")
    for name in RETURNS_VIEWS_OF_INPUT:
        if name in flags:
            flags[name].add("view")
    x = torch.randn(3, dtype=torch.float64)
    for name, probe in RETURNS_INPUT_PROBES.items():
        if probe(x) is not x:
            raise AssertionError(f"probe of `{name}` no longer returns its input")
        flags.setdefault(name, set()).add("returns_input")
    x2 = torch.randn(3, 2, dtype=torch.float64)
    for name, probe in FRESH_PROBES.items():
        if probe(x2) is x2:
            raise AssertionError(f"probe of `{name}` returns its input")
    for name in list(flags):
        tensors = [_tensor_returns(o) for o in overloads.get(name, [])]
        tensors = [t for t in tensors if t]
        if tensors and all(c.endswith("'") for t in tensors for c in t):
            flags[name].add("nograd")
    return overloads, flags


def _sharing() -> list[str]:
    """The operators of `SHARES_PROBES`, each checked to share its input's memory."""
    x = torch.randn(3, 2, dtype=torch.float64)
    for name, probe in SHARES_PROBES.items():
        shared = probe(x)
        same = isinstance(shared, torch.Tensor) and (
            shared.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        )
        if not same:
            raise AssertionError(
                f"probe of `{name}` no longer shares its input's memory"
            )
    return list(SHARES_PROBES)


def _tensor_returns(overload: str) -> list[str]:
    """The codes of the tensor results of one overload."""
    returns = overload.split("->", 1)[1]
    codes = [c.rpartition(":")[2] for c in returns.split(",") if c]
    return [c for c in codes if c.rstrip("'").rstrip("?").removesuffix("[]") == "T"]


# -- Python names --------------------------------------------------------------------


def annotation_code(annotation: Any) -> str:
    """The compact code of a Python annotation (`Tensor`, `tuple[Tensor, ...]`)."""
    if annotation is inspect.Signature.empty or annotation is Any:
        return "?"
    if "TypeIs[" in repr(annotation) or "TypeGuard[" in repr(annotation):
        return "b"
    if isinstance(annotation, str):
        text = annotation.replace("torch.", "").replace("_Tensor", "Tensor")
        simple = {"Tensor": "T", "int": "i", "float": "f", "bool": "b", "str": "s"}
        return simple.get(text, "?")
    if annotation is type(None):
        return "N"
    if annotation is torch.Tensor:
        return "T"
    simple_types = {int: "i", float: "f", bool: "b", str: "s", complex: "n"}
    if annotation in simple_types:
        return simple_types[annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        codes = {annotation_code(a) for a in args if a is not type(None)}
        if len(codes) == 1:
            code = codes.pop()
            return code + "?" if type(None) in args else code
        return "?"
    if origin in (list, tuple) or origin in (typing.List, typing.Tuple):  # noqa: UP006
        inner = [annotation_code(a) for a in args if a is not Ellipsis]
        if origin is tuple and args and Ellipsis not in args:
            return "(" + ",".join(inner) + ")"
        if len(set(inner)) == 1 and inner[0] in ("T", "i", "f", "b"):
            return inner[0] + "[]"
        return "?"
    if isinstance(annotation, type) and issubclass(annotation, torch.Tensor):
        return "T"
    return "o" if isinstance(annotation, type) else "?"


def python_signature(function: Callable[..., Any]) -> str | None:
    """`params->returns` of a Python function from its signature and annotations."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    returns = annotation_code(signature.return_annotation)
    if returns == "?":
        return None
    parts: list[str] = []
    keyword = False
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            return None
        if param.kind is param.KEYWORD_ONLY and not keyword:
            parts.append("*")
            keyword = True
        default = "=" if param.default is not param.empty else ""
        parts.append(f"{param.name}:{annotation_code(param.annotation)}{default}")
    if returns.startswith("("):
        returns = returns[1:-1]
    return f"|{','.join(parts)}->{returns}"


def _probe_method(name: str, returns_input: set[str]) -> str | None:
    """Call a tensor method that takes no argument and record what it returns."""
    value: object = None
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.randn(3, dtype=dtype, requires_grad=True)
        try:
            value = getattr(x, name)()
        except Exception:
            return None
        if value is x:
            returns_input.add(name)
    return f"|->{_value_code(value)}"


def _probe_function(function: Callable[..., Any]) -> str | None:
    """`input->returns` of an unannotated Python function of one tensor and nothing
    else (`F.softsign(input)`), its return found by calling it once: with no other
    parameter, no flag can change what it returns."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    if len(params) != 1 or params[0].kind is not params[0].POSITIONAL_OR_KEYWORD:
        return None
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = function(x)
    except Exception:
        return None
    if not isinstance(value, torch.Tensor) or value is x:
        return None
    return f"|{params[0].name}:T->{_value_code(value)}"


def _value_code(value: object) -> str:
    """The code of a value a probe returned."""
    if isinstance(value, torch.Tensor):
        return "T" if value.requires_grad else "T'"
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "i"
    if isinstance(value, float):
        return "f"
    if value is None:
        return "N"
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return "i[]"
    return "o"


def attribute_table() -> dict[str, str]:
    """What each public non-method attribute of a tensor holds (`shape`, `T`, `data`)."""
    found = {}
    for name in sorted(dir(torch.Tensor)):
        if name.startswith("_") or callable(getattr(torch.Tensor, name, None)):
            continue
        x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = getattr(x, name)
        except Exception:
            continue
        found[name] = _value_code(value)
    return found


def python_table(
    aten: dict[str, list[str]], returns_input: set[str]
) -> tuple[dict[str, str], dict[str, Any]]:
    """Python names that need their own entry, and the boolean-dispatched ones."""
    from torch._jit_internal import boolean_dispatched

    entries: dict[str, str] = {}
    dispatch: dict[str, Any] = {}
    by_function = {id(f): info for f, info in boolean_dispatched.items()}
    for prefix, (namespace, aten_prefix) in NAMESPACES.items():
        for name in sorted(dir(namespace)):
            if name.startswith("_"):
                continue
            function = getattr(namespace, name, None)
            qualified = f"{prefix}.{name}"
            if isinstance(function, type) and prefix == "torch":
                # Constructors: `torch.Size(...)`, `torch.finfo(...)`, `torch.Tensor(...)`.
                made = "T'" if issubclass(function, torch.Tensor) else "o"
                entries[qualified] = f"|->{made}"
                continue
            if not callable(function) or isinstance(function, type):
                continue
            info = by_function.get(id(function))
            if info is not None:
                true = python_signature(info["if_true"])
                false = python_signature(info["if_false"])
                if true and false:
                    dispatch[qualified] = (
                        info["arg_name"],
                        info["default"],
                        true,
                        false,
                    )
                continue
            target = aten_prefix + name
            if isinstance(function, types.FunctionType):
                found = python_signature(function)
                if found is None and prefix == "torch.nn.functional":
                    found = _probe_function(function)
                if found is not None:
                    entries[qualified] = found
                elif target != name and target in aten:
                    entries[qualified] = f"@{target}"
                continue
            if target in aten:
                if target != name:
                    entries[qualified] = f"@{target}"
                continue
            own = getattr(function, "__name__", "")
            if own in aten and prefix == "torch.nn.functional":
                # A builtin of another name: `F.logsigmoid` is `torch._C._nn.log_sigmoid`.
                entries[qualified] = f"@{own}"
                continue
            if prefix == "torch.Tensor":
                probed = _probe_method(name, returns_input)
                if probed is not None:
                    entries[qualified] = probed
    return entries, dispatch


def _variadic() -> list[str]:
    """The Python-level functions of the namespaces whose first parameter is `*args`."""
    found = []
    for prefix, (namespace, _) in NAMESPACES.items():
        for name in sorted(dir(namespace)):
            function = getattr(namespace, name, None)
            if name.startswith("_") or not isinstance(function, types.FunctionType):
                continue
            try:
                params = list(inspect.signature(function).parameters.values())
            except (TypeError, ValueError):
                continue
            if params and params[0].kind is inspect.Parameter.VAR_POSITIONAL:
                found.append(f"{prefix}.{name}")
    return found


def _wrappers() -> list[str]:
    """The functions of the namespaces written in Python (`torch.tensordot`,
    `torch.Tensor.unique`): they take keywords of their own, not their schema's."""
    found = []
    for prefix, (namespace, _) in NAMESPACES.items():
        for name in sorted(dir(namespace)):
            function = getattr(namespace, name, None)
            if not name.startswith("_") and isinstance(function, types.FunctionType):
                found.append(f"{prefix}.{name}")
    return found


def _python_random(python: dict[str, str], flags: dict[str, set[str]]) -> list[str]:
    """Python functions with their own entry (no aten operator of their name) whose
    code calls an operator that draws random numbers (`F.gumbel_softmax` calls
    `exponential_`), by the names its code objects use."""
    random = {n for n, f in flags.items() if "random" in f}
    found = []
    for qualified in sorted(python):
        module, _, name = qualified.rpartition(".")
        namespace = NAMESPACES.get(module, (None, ""))[0]
        function = getattr(namespace, name, None) if namespace is not None else None
        if not isinstance(function, types.FunctionType) or name in flags:
            continue
        codes, used = [function.__code__], set[str]()
        while codes:
            code = codes.pop()
            used.update(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        if used & random:
            found.append(name)
    return found


# -- rendering ----------------------------------------------------------------------


def _out_of_place(
    flags: dict[str, set[str]], aten: dict[str, list[str]]
) -> dict[str, str]:
    twins = {}
    for name, mine in flags.items():
        if "inplace" in mine and name.endswith("_") and name[:-1] in aten:
            twins[name] = name[:-1]
    return twins


def _lines(items: Iterable[str], indent: str = "    ") -> str:
    return "".join(f"{indent}{item}\n" for item in items)


def render() -> str:
    """Return the text of `table.py` for the installed torch."""
    aten, flags = aten_table()
    probed: set[str] = set()
    python, dispatch = python_table(aten, probed)
    for name in probed:
        flags.setdefault(name, set()).add("returns_input")
    for name in _python_random(python, flags):
        flags.setdefault(name, set()).add("random")
    for name in _sharing():
        flags.setdefault(name, set()).add("shares")
    out = [
        '"""Operator facts of torch, generated by `python -m s2sgrad.opfacts.build`.',
        "",
        "Do not edit: rebuild it. See `s2sgrad/opfacts/__init__.py` for the format.",
        '"""',
        "",
        "# fmt: off",
        f"TORCH_VERSION = {torch.__version__.split('+')[0]!r}",
        "",
        "#: aten operator -> its overloads, `overload|params->returns`.",
        "ATEN: dict[str, tuple[str, ...]] = {",
    ]
    for name in sorted(aten):
        overloads = ", ".join(repr(o) for o in sorted(aten[name]))
        out.append(f"    {name!r}: ({overloads},),")
    out.append("}")
    out.append("")
    out.append("#: Python name -> `@aten_name`, or its own `|params->returns`.")
    out.append("PYTHON: dict[str, str] = {")
    out += [f"    {k!r}: {python[k]!r}," for k in sorted(python)]
    out.append("}")
    out.append("")
    out.append(
        "#: Python name -> (flag parameter, its default, signature if true, if false)."
    )
    out.append("DISPATCH: dict[str, tuple[str, bool, str, str]] = {")
    out += [f"    {k!r}: {tuple(dispatch[k])!r}," for k in sorted(dispatch)]
    out.append("}")
    for flag, title in [
        ("nograd", "Operators whose outputs carry no gradient."),
        ("view", "Operators whose result shares memory with an input."),
        ("returns_input", "Operators that may return their input object itself."),
        (
            "shares",
            "Operators whose result may share memory with any tensor argument.",
        ),
        ("random", "Operators that draw random numbers."),
        ("pointwise", "Elementwise operators."),
    ]:
        names = sorted(n for n, f in flags.items() if flag in f)
        out.append("")
        out.append(f"#: {title}")
        out.append(f"{flag.upper()}: frozenset[str] = frozenset({{")
        out.append(_lines(repr(n) + "," for n in names).rstrip("\n"))
        out.append("})")
    attributes = attribute_table()
    out.append("")
    out.append("#: What a tensor's public attributes hold (`shape` -> `i[]`).")
    out.append("TENSOR_ATTRIBUTES: dict[str, str] = {")
    out += [f"    {k!r}: {attributes[k]!r}," for k in sorted(attributes)]
    out.append("}")
    methods = sorted(
        n
        for n in dir(torch.Tensor)
        if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))
    )
    out.append("")
    out.append("#: The public methods of `torch.Tensor`.")
    out.append("TENSOR_METHODS: frozenset[str] = frozenset({")
    out.append(_lines(repr(n) + "," for n in methods).rstrip("\n"))
    out.append("})")
    out.append("")
    out.append(
        "#: Operator -> its outputs that torch returns without a gradient although"
    )
    out.append("#: they hold floating-point values (statistics, not indices).")
    out.append("DETACHED: dict[str, tuple[int, ...]] = {")
    out += [f"    {k!r}: {tuple(DETACHED[k])!r}," for k in sorted(DETACHED)]
    out.append("}")
    out.append("")
    out.append(
        "#: Python functions that take their tensors as `*tensors` (`torch.einsum`,"
    )
    out.append("#: `torch.meshgrid`): one tensor there is one of them, not a list.")
    out.append("VARIADIC: frozenset[str] = frozenset({")
    out.append(_lines(repr(n) + "," for n in _variadic()).rstrip("\n"))
    out.append("})")
    out.append("")
    out.append(
        "#: Functions written in Python: their keywords are their own, not a schema's."
    )
    out.append("WRAPPERS: frozenset[str] = frozenset({")
    out.append(_lines(repr(n) + "," for n in _wrappers()).rstrip("\n"))
    out.append("})")
    twins = _out_of_place(flags, aten)
    out.append("")
    out.append("#: In-place operator -> its out-of-place twin.")
    out.append("OUT_OF_PLACE: dict[str, str] = {")
    out += [f"    {k!r}: {twins[k]!r}," for k in sorted(twins)]
    out.append("}")
    return "\n".join(out) + "\n"


def table_path() -> Path:
    return Path(__file__).with_name("table.py")


def main() -> int:
    table_path().write_text(render(), encoding="utf-8")
    print(f"wrote {table_path()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
