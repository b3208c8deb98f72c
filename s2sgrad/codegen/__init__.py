"""Codegen: differentiated records to the text of a generated module.

Takes the parsed module, its differentiated records and an `Origin` (where the source
lives, by display path and importable name); returns black-formatted module text. The
text is a pure function of those inputs: no timestamps, absolute paths or set order.
"""

from __future__ import annotations

import ast

import libcst as cst
import libcst.matchers as m

from s2sgrad.autodiff.inline import names_read
from s2sgrad.autodiff.record import Differentiated
from s2sgrad.codegen import types
from s2sgrad.codegen.emit import emit
from s2sgrad.codegen.fmt import format_code
from s2sgrad.codegen.function import SAVE_HELPERS, uses_save_helpers
from s2sgrad.codegen.guard import check_generated
from s2sgrad.codegen.imports import import_block
from s2sgrad.cst import bound, module
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend.model import Differentiator, ParsedModule
from s2sgrad.header import Origin, header
from s2sgrad.lines import split_lines
from s2sgrad.names import Names
from s2sgrad.options import Options
from s2sgrad.values import SETITEM_NAME, param_value

_ACCUMULATE = '''
def _accumulate(total: Grad, grad: Grad) -> Grad:
    """Add gradients where None stands for zero."""
    return total if grad is None else grad if total is None else total + grad
'''.lstrip()

#: With list parameters, a gradient may be a list: it is added element by element.
_ACCUMULATE_LISTS = '''
def _accumulate(total: Any, grad: Any) -> Any:
    """Add gradients where None is a gradient known to be zero; lists element-wise."""
    if grad is None:
        return total
    if total is None:
        return grad
    if isinstance(total, (list, tuple)):
        return [_accumulate(t, g) for t, g in zip(total, grad, strict=True)]
    return total + grad
'''.lstrip()

#: Forward's item store on a differentiable tensor (values.SETITEM), out of place.
_SETITEM = f'''
def {SETITEM_NAME}(tensor: Tensor, index: Any, value: Any) -> Tensor:
    """`tensor[index] = value` on a copy: each value of forward is bound once."""
    tensor = tensor.clone()
    tensor[index] = value
    return tensor
'''.lstrip()

#: The runtime every generated module carries (after its ops: a reader starts with the
#: differentiators). `Function.apply` binds `inspect.signature(forward)` on every call,
#: which costs more than a small op; outside torch.func transforms, forward mode and
#: torch.compile its C++ base does the same work without it. Where a torch.func
#: transform or a `forward_ad` dual level may ask for tangents, the op runs a subclass
#: of its Function with a `jvp`: torch's own forward mode through the Function's
#: `forward`, that is through the closure's forward statements. The Function itself has
#: no `jvp`, because torch.compile traces no custom `jvp`. Private torch API is read in
#: one place and falls back to `Function.apply` when any piece is gone.
RUNTIME = '''
# The s2sgrad runtime, the same in every generated module: Function.apply with forward
# mode (jvp) where torch.func or forward_ad may ask for it, and without the per-call
# signature binding elsewhere.

try:  # private torch API; another torch takes Function.apply as is
    from torch._C import _are_functorch_transforms_active as _transforms_active
    from torch._C._functorch import get_interpreter_stack as _interpreters
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap
    from torch.autograd.forward_ad import _set_fwd_grad_enabled

    _base_apply: Any = torch._C._FunctionBase.__dict__["apply"]
except (ImportError, AttributeError, KeyError):
    _base_apply = None
_JVP = "s2sgrad jvp"  # the ctx attribute of forward mode, no name of the user's
_unpack_dual: Any = forward_ad.unpack_dual


def _apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """`function.apply(*args)`, with a `jvp` where forward mode may ask for one."""
    try:
        if torch.compiler.is_compiling():  # which traces no custom jvp
            return function.apply(*args)  # type: ignore[no-untyped-call]
        if _base_apply is None:
            return _with_jvp(function).apply(*args)
        transforms = _transforms_active()
        if transforms and _jvp_over_jvp(function):
            return function.forward(*args)  # forward mode only: the forward's own code
        if transforms or getattr(forward_ad, "_current_level", 0) >= 0:
            return _with_jvp(function).apply(*args)
        return _base_apply.__get__(None, function)(*_unwrap(args))
    except (TypeError, AttributeError) as error:
        _number_for_tensor(function, args, error)
        raise


def _number_for_tensor(function: Any, args: tuple[Any, ...], error: Exception) -> None:
    """Say so when `error` came from a number passed where forward takes a tensor."""
    signature = inspect.signature(function.forward)
    try:
        bound = signature.bind(*args).arguments
    except TypeError:
        return
    for name, value in bound.items():
        annotation = signature.parameters[name].annotation
        if annotation in (Tensor, "Tensor") and isinstance(value, (int, float, complex)):
            raise TypeError(
                f"{function.__name__} takes `{name}` as a tensor; got {value!r}. "
                "Backward returns a gradient for it, and a "
                "parameter without annotation that gets one is a tensor, as TorchScript "
                "reads it. Annotate it `torch.Tensor | float` to pass numbers"
            ) from error


def _jvp_over_jvp(function: type[torch.autograd.Function]) -> bool:
    """Tell whether torch.func nests forward mode in forward mode here. torch does not
    differentiate a Function's `jvp`, so that would lose the second-order tangents:
    without reverse mode the op runs its forward's own code, with it this is an error."""
    keys = [str(i.key()) for i in _interpreters() or ()]
    if keys.count("TransformType.Jvp") < 2:
        return False
    if "TransformType.Grad" in keys:
        raise NotImplementedError(
            f"`{function.__name__}`: torch.func forward mode over forward mode with "
            "reverse mode beside it (jacfwd over jacfwd over grad, say) would lose "
            "second-order tangents of a custom Function; use jacfwd over jacrev"
        )
    return True


@functools.cache
def _with_jvp(function: type[torch.autograd.Function]) -> Any:
    """`function` with a `jvp`. Its input tensors are saved after what its backward
    reads, for backward and forward alike (torch.func tracks one set)."""

    def forward(*args: Any) -> Any:
        return _distinct(function.forward(*args))

    def setup_context(ctx: Any, inputs: Context, output: Any) -> None:
        function.setup_context(kept := _Kept(ctx), inputs, output)
        where = [i for i, x in enumerate(inputs) if isinstance(x, Tensor)]
        tensors = [*kept.saved, *(inputs[i] for i in where)]
        ctx.save_for_backward(*tensors)
        ctx.save_for_forward(*tensors)
        rest = [None if i in where else x for i, x in enumerate(inputs)]
        setattr(ctx, _JVP, (len(kept.saved), where, rest))

    def backward(ctx: Any, *grads: Grad) -> Any:
        return function.backward(_Kept(ctx), *grads)

    def jvp(ctx: Any, *tangents: Grad) -> Any:
        start, where, inputs = getattr(ctx, _JVP)
        for i, tensor in zip(where, ctx.saved_tensors[start:], strict=True):
            inputs[i] = tensor
        return _distinct(_jvp(function.forward, inputs, tangents))

    methods = (forward, setup_context, backward, jvp)
    own = {method.__name__: staticmethod(method) for method in methods}
    return type(function.__name__, (function,), own)


class _Kept:
    """The ctx that a Function's own methods see: their saved tensors only."""

    def __init__(self, ctx: Any) -> None:
        self.__dict__.update(ctx=ctx, saved=())

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.__dict__["saved"] = tensors

    @property
    def saved_tensors(self) -> Any:
        return self.ctx.saved_tensors[: getattr(self.ctx, _JVP)[0]]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ctx, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.ctx, name, value)


def _jvp(forward: Any, inputs: list[Any], tangents: tuple[Grad, ...]) -> Any:
    """The tangents of `forward(*inputs)`: torch's forward mode through its code."""
    wrt = [i for i, tangent in enumerate(tangents) if tangent is not None]
    result: list[Any] = []

    def run(*values: Tensor) -> list[Tensor]:
        for i, value in zip(wrt, values):
            inputs[i] = value
        result[:] = [forward(*inputs)]
        return [o for o in _outputs(result[0]) if _differentiable(o)]

    tangent = [tangents[i] for i in wrt]
    try:
        if _base_apply is not None and not _transforms_active():  # forward_ad
            with _set_fwd_grad_enabled(True):  # at its one dual level: no nesting
                primal = [_unpack_dual(inputs[i]).primal for i in wrt]
                found = run(*map(forward_ad.make_dual, primal, tangent))
                found = [_unpack_dual(o).tangent for o in found]
        else:  # torch.func transforms nest their own levels
            primal = [inputs[i] for i in wrt]
            found = torch.func.jvp(run, tuple(primal), tuple(tangent))[1]
    except NotImplementedError as error:  # an op without a forward-mode formula
        raise _no_jvp(error) from error
    out = iter(found)
    out_tangents = [next(out) if _differentiable(o) else None for o in _outputs(result[0])]
    return tuple(out_tangents) if isinstance(result[0], tuple) else out_tangents[0]


def _distinct(outputs: Any) -> Any:
    """`outputs` with a second copy of a tensor cloned: forward mode gives each output
    tensor its own tangent, where the closure may return one tensor twice."""
    if not isinstance(outputs, tuple):
        return outputs
    seen: set[int] = set()
    found = []
    for o in outputs:
        if isinstance(o, Tensor) and id(o) in seen:
            o = o.clone()
        seen.add(id(o))
        found.append(o)
    return tuple(found)


def _outputs(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


def _differentiable(value: Any) -> bool:
    return isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex())


def _no_jvp(error: NotImplementedError) -> NotImplementedError:
    """`error`, naming the forward statement that ran the op."""
    here = _jvp.__code__.co_filename
    tb = traceback.walk_tb(error.__traceback__)
    frame, line = [(f, n) for f, n in tb if f.f_code.co_filename == here][-1]
    statement = linecache.getline(here, line).strip() or f"line {line}"
    return NotImplementedError(
        f"forward mode (jvp) through `{frame.f_code.co_name}` ({here}:{line}): "
        f"`{statement}` runs a torch op without a forward-mode derivative. "
        + str(error).splitlines()[0]
    )
'''.lstrip()


#: The runtime of `compile=true` (design.md, "Compiled mode"): f_forward, f_backward
#: and f_backward's own gradient at the next order run inductor-compiled; beyond, eager.
COMPILED_RUNTIME = '''
# Compiled mode (compile=true): inductor runs f_forward, f_backward, and f_backward's
# own gradient once (a double backward). Beyond that, and where compiled code cannot
# run, the same functions run eagerly, so every order stays right.


def _compiled(function: Any, differentiable: bool = False) -> Any:
    """`function` compiled by inductor, whole graph, where compiled code can run; a
    `differentiable` one (f_backward) also when differentiated, through `_Twice`."""
    compiled = torch.compile(function, fullgraph=True)
    eager = False

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal eager
        grad = torch.is_grad_enabled()
        if eager or _eager_here() or (grad and not differentiable):
            return function(*args, **kwargs)

        def call() -> Any:
            if not grad:
                return compiled(*args, **kwargs)  # type: ignore[no-untyped-call]
            tensors: list[Tensor] = []
            template = _flatten((args, kwargs), tensors)
            found = _Twice.apply(function, compiled, template, *tensors)  # type: ignore[no-untyped-call]
            return _rebuild(found[-1], iter(found[:-1]))

        try:
            try:
                return call()
            except Exception as error:
                if type(error).__name__ != "FailOnRecompileLimitHit":
                    raise
                with _recompiles():  # room for more graphs, only when asked for
                    return call()
        except Exception as error:
            if not type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
                raise
            result = function(*args, **kwargs)  # the user's own error raises here
            if type(error).__name__ != "FailOnRecompileLimitHit":
                raise _compile_failed(function, error) from error
            warnings.warn(f"`{function.__name__}`: too many shapes; eager from here on")
            eager = True
            return result

    return run


def _recompiles() -> Any:
    """Room for 64 graphs per function, not torch's 8: f_backward has one per pattern of
    absent gradients, grad mode and shape class. Entered only when torch's limit is hit
    (it costs about 30 us); private torch API, else as is."""
    try:
        return torch._dynamo.config.patch(recompile_limit=64)
    except (AttributeError, KeyError):
        return contextlib.nullcontext()


class _Twice(torch.autograd.Function):
    """f_backward, differentiable: its forward runs the compiled f_backward with
    autograd (one joint graph), its backward that graph's backward once, else an eager
    VJP on fresh aliases (partial derivatives, differentiable to any order)."""

    @staticmethod
    def forward(function: Any, compiled: Any, template: Any, *tensors: Tensor) -> Any:
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            args, kwargs = _rebuild(template, iter(leaves))
            outputs: list[Tensor] = []
            found = _flatten(compiled(*args, **kwargs), outputs)
        return (*(o.detach() for o in outputs), (leaves, outputs), found)

    @staticmethod
    def setup_context(ctx: Any, inputs: Context, output: Any) -> None:
        ctx.function, _, ctx.template = inputs[:3]
        ctx.inner = output[-2]
        ctx.save_for_backward(*inputs[3:])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, *cotangents: Grad) -> Any:
        tensors = ctx.saved_tensors
        create = torch.is_grad_enabled()
        if create or ctx.inner is None:  # order 3 and up, or a second backward
            with torch.enable_grad():
                sources = [t.view_as(t) if t.requires_grad else t for t in tensors]
                args, kwargs = _rebuild(ctx.template, iter(sources))
                outputs: list[Tensor] = []
                _flatten(ctx.function(*args, **kwargs), outputs)
        else:
            (sources, outputs), ctx.inner = ctx.inner, None
        wanted = [i for i, t in enumerate(sources) if t.requires_grad]
        pairs = [
            (o, c)
            for o, c in zip(outputs, cotangents[:-2], strict=True)
            if c is not None and o.requires_grad
        ]
        grads: list[Grad] = [None] * len(tensors)
        if pairs and wanted:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [sources[i] for i in wanted],
                [c for _, c in pairs],
                create_graph=create,
                allow_unused=True,
            )
            for i, grad in zip(wanted, found, strict=True):
                grads[i] = grad
        return (None, None, None, *grads)


def _flatten(value: Any, tensors: list[Tensor]) -> Any:
    """`value` as a hashable template with `_SLOT` for each tensor, put in `tensors`."""
    if isinstance(value, Tensor):
        tensors.append(value)
        return _SLOT
    if type(value) in (tuple, list):
        return (type(value), tuple(_flatten(v, tensors) for v in value))
    if type(value) is dict:
        return (dict, tuple((k, _flatten(v, tensors)) for k, v in value.items()))
    return value


def _rebuild(template: Any, tensors: Iterator[Tensor]) -> Any:
    """The value `_flatten` made `template` of, with `tensors` in its slots."""
    if template is _SLOT:
        return next(tensors)
    if type(template) is tuple and template[:1] in ((tuple,), (list,)):
        return template[0](_rebuild(t, tensors) for t in template[1])
    if type(template) is tuple and template[:1] == (dict,):
        return {k: _rebuild(t, tensors) for k, t in template[1]}
    return template


_SLOT = "s2sgrad: a tensor goes here"  # no constant of f_backward is this string


def _eager_here() -> bool:
    """Tell whether compiled code must not run: inside torch.compile (which compiles
    the eager code itself), torch.func transforms or forward mode."""
    return (
        torch.compiler.is_compiling()
        or _base_apply is None
        or _transforms_active()
        or getattr(forward_ad, "_current_level", 0) >= 0
    )


def _compile_failed(function: Any, error: Exception) -> RuntimeError:
    return RuntimeError(
        f"`{function.__name__}` runs compiled (s2sgrad compile=true), but torch.compile "
        f"cannot compile it here: {str(error).strip().splitlines()[0]}. Turn it off: "
        "convert without --compile, set `compile = false` in [tool.s2sgrad], or put "
        "`# s2sgrad: compile=false` in the differentiator."
    )
'''.lstrip()


def generate(
    parsed: ParsedModule,
    records: list[Differentiated],
    options: Options,
    origin: Origin,
) -> str:
    """Return the generated module for `records`, formatted with black."""
    _check_collisions(parsed, records)
    siblings = {item.source.name for item in records}
    used = [
        n for item in records for n in item.source.globals_used if n not in siblings
    ]
    body: list[cst.BaseStatement] = []
    if any(item.gradients and item.gradients.blocks for item in records):
        lists = any(
            param_value(p).tensor_list for item in records for p in item.source.params
        )
        body.append(cst.parse_statement(_ACCUMULATE_LISTS if lists else _ACCUMULATE))
    if any(uses_save_helpers(item) for item in records):
        body += cst.parse_module(SAVE_HELPERS.lstrip()).body
    if any(_stores_items(item) for item in records):
        body.append(cst.parse_statement(_SETITEM))
    taken = set(parsed.module_names) | {
        name for item in records for name in vars(Names.of(item.source.name)).values()
    }
    compiled = {item.source.name: _compiles(item, options) for item in records}
    for item in records:
        body += emit(
            item,
            origin.display_path,
            siblings,
            taken,
            options.line_length,
            compiled[item.source.name],
        )
    code = module(body).code + "\n\n" + RUNTIME
    if any(compiled.values()):  # before the differentiators, which call `_compiled`
        code = COMPILED_RUNTIME + "\n\n" + code
    aliases, read = _aliases(code)
    imports = _imports(parsed, records, origin, used, read)
    code = aliases + "\n\n" + code
    formatted = format_code("\n".join(imports) + "\n" + code, options.line_length)
    text = (
        header(origin.display_path, parsed.source, options.key(), formatted) + formatted
    )
    check_generated(text, options.line_length)
    return text


def _stores_items(item: Differentiated) -> bool:
    """Whether forward's statements call `_setitem` (values.SETITEM)."""
    call = m.Call(func=m.Name(SETITEM_NAME))
    return any(m.findall(s, call) for s in item.source.statements)


def _compiles(item: Differentiated, options: Options) -> bool:
    """Whether the differentiator runs compiled: its pragma, else the option."""
    pragma = item.source.pragmas.get("compile")
    return options.compile if pragma is None else pragma == "true"


def _aliases(code: str) -> tuple[str, set[str]]:
    """The type aliases (types.ALIASES) that the module's code uses, defined; and every
    name the code (aliases included) reads. Read with `ast`: a libcst visit of the
    whole generated module would cost more than generating it."""
    tree = ast.parse(code)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    read |= _read_in_string_annotations(tree)
    lines = [
        f"{name} = {meaning}  # {note}\n"
        for name, (meaning, note) in types.ALIASES.items()
        if name in read
    ]
    aliases = "".join(lines)
    return aliases, read | {
        n.id for n in ast.walk(ast.parse(aliases)) if isinstance(n, ast.Name)
    }


def _read_in_string_annotations(tree: ast.Module) -> set[str]:
    """The names that annotations written as strings read (`xs: "List[Tensor]"`)."""
    annotations: list[ast.expr | None] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    found: set[str] = set()
    for annotation in annotations:
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                inner = ast.parse(annotation.value, mode="eval")
            except SyntaxError:
                continue
            found |= {n.id for n in ast.walk(inner) if isinstance(n, ast.Name)}
    return found


def _imports(
    parsed: ParsedModule,
    records: list[Differentiated],
    origin: Origin,
    used: list[str],
    read: set[str],
) -> list[str]:
    """The import lines: what the differentiators use, and what generated code reads."""
    # Names only the dropped parts read (the closure's return annotation) stay out.
    used = [name for name in used if name in read]
    extra = [
        "from typing import Any, cast",
        "import functools",
        "import inspect",
        "import linecache",
        "import traceback",
        "from torch.autograd import forward_ad",
    ]
    if "_compiled" in read:
        extra += [
            "import contextlib",
            "import warnings",
            "from collections.abc import Iterator",
        ]
    if types.TENSOR in read:
        extra.append(f"from torch import {types.TENSOR}")
    if any(item.once_differentiable for item in records):
        extra.append("from torch.autograd.function import once_differentiable")
    if "math" not in used and any(_rules_read_math(item) for item in records):
        extra.append("import math")
    try:
        imports = import_block(
            used, parsed.globals, origin.module_name, extra, _postponed(parsed)
        )
    except ValueError:
        first = records[0].source
        raise TransformError(
            [
                Diagnostic(
                    "S2S115",
                    "the differentiators use module-level helpers, but "
                    f"{origin.display_path} is not importable as a module",
                    origin.display_path,
                    first.first_line,
                    1,
                    "",
                    "convert a file on disk, inside a package or on sys.path",
                ),
            ]
        ) from None
    return imports


def _postponed(parsed: ParsedModule) -> bool:
    """Tell whether the source says `from __future__ import annotations`."""
    future = m.ImportFrom(
        module=m.Name("__future__"),
        names=[m.ZeroOrMore(), m.ImportAlias(m.Name("annotations")), m.ZeroOrMore()],
    )
    return any(
        m.matches(
            statement,
            m.SimpleStatementLine(body=[m.ZeroOrMore(), future, m.ZeroOrMore()]),
        )
        for statement in parsed.module.body
    )


def _rules_read_math(item: Differentiated) -> bool:
    """Tell whether inlined derivative rules use `math` (rules may read torch and math)."""
    blocks = item.gradients.blocks if item.gradients else ()
    return any("math" in names_read(block) for block in blocks)


def _only_called(diff: Differentiator, name: str) -> bool:
    """Tell whether every use of `name` in `diff` is a call `name(...)`."""
    calls = m.findall(diff.forward, m.Call(func=m.Name(name)))
    uses = m.findall(diff.forward, m.Name(name))
    return len(calls) == len(uses)


#: Module-level names the generated module may define or import for itself.
_OWN_NAMES = (
    "_apply",
    "_base_apply",
    "_transforms_active",
    "_interpreters",
    "_unwrap",
    "_set_fwd_grad_enabled",
    "_with_jvp",
    "_jvp_over_jvp",
    "_Kept",
    "_jvp",
    "_JVP",
    "_unpack_dual",
    "_outputs",
    "_distinct",
    "_differentiable",
    "_no_jvp",
    "_number_for_tensor",
    "_compiled",
    "_Twice",
    "_flatten",
    "_rebuild",
    "_SLOT",
    "_recompiles",
    "_eager_here",
    "_compile_failed",
    "_accumulate",
    "_save",
    "_saved",
    SETITEM_NAME,
    *types.ALIASES,
)

#: Module-level names the generated code reads inside the functions that hold the
#: user's code (an accumulation, the op's apply, `math` in inlined rules): a parameter
#: or a local of the same name would hide them.
_SHADOWED = frozenset(
    {"_accumulate", "_apply", "_save", "_saved", SETITEM_NAME, "math"}
)

#: Names the generated module imports: the same objects are no collision.
_IMPORTED = {
    "Any": "from typing import Any",
    "cast": "from typing import cast",
    types.TENSOR: f"from torch import {types.TENSOR}",
    "once_differentiable": "from torch.autograd.function import once_differentiable",
    "functools": "import functools",
    "inspect": "import inspect",
    "linecache": "import linecache",
    "traceback": "import traceback",
    "warnings": "import warnings",
    "contextlib": "import contextlib",
    "Iterator": "from collections.abc import Iterator",
    "forward_ad": "from torch.autograd import forward_ad",
}


def _check_collisions(parsed: ParsedModule, records: list[Differentiated]) -> None:
    generated = dict.fromkeys(_OWN_NAMES, "its own use")
    for name, statement in _IMPORTED.items():
        spec = parsed.globals.get(name)
        if spec is not None and spec.import_code != statement:
            generated[name] = "its own use"
    for item in records:
        names = Names.of(item.source.name)
        for name in (names.forward, names.backward, names.function, names.op):
            generated[name] = f"`{item.source.name}`"
    found = []
    for item in records:
        diff = item.source
        siblings = {other.source.name for other in records}
        for name in diff.globals_used:
            calls_sibling = name in siblings and _only_called(diff, name)
            if name in generated and name in parsed.globals and not calls_sibling:
                found.append(
                    Diagnostic(
                        "S2S114",
                        f"`{diff.name}` uses the module-level name `{name}`, which the "
                        f"generated module defines for {generated[name]}",
                        parsed.path,
                        diff.first_line,
                        1,
                        split_lines(parsed.source)[diff.first_line - 1],
                        "rename the helper, or call the other differentiator's op from a "
                        "plain helper function",
                    )
                )
    for item in records:
        diff = item.source
        own = (
            bound(diff.forward)
            | set(diff.backward_locals)
            | {p.name for p in diff.params}
        )
        for name in sorted(own & _SHADOWED):
            text = split_lines(parsed.source)[diff.first_line - 1]
            found.append(
                Diagnostic(
                    "S2S114",
                    f"`{diff.name}` binds `{name}`, a name the generated code reads "
                    "inside its functions for its own use, where this binding would "
                    "hide it",
                    parsed.path,
                    diff.first_line,
                    text.find(diff.name) + 1 or 1,
                    text,
                    f"rename `{name}` in `{diff.name}`",
                )
            )
    if found:
        raise TransformError(found)
