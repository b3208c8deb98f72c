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
from s2sgrad.autodiff.vjp import REDUCE
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
    """Add gradients where None stands for zero. `grad` has its value's shape; `total`
    may be the closure's gradient unreduced, as PyTorch allows: summed to that shape
    first, as autograd's engine would, or the sum would count `grad` once per row."""
    if total is None or grad is None:
        return grad if total is None else total
    if total.shape != grad.shape:
        total = total.sum_to_size(grad.shape)
    return total + grad
'''.lstrip()

#: With list parameters, a gradient may be a list: it is added element by element.
_ACCUMULATE_LISTS = '''
def _accumulate(total: Any, grad: Any) -> Any:
    """Add gradients where None stands for zero; lists element by element. `grad` has
    its value's shape; `total` may be the closure's gradient unreduced, as PyTorch
    allows: summed to that shape first, as autograd's engine would."""
    if total is None or grad is None:
        return grad if total is None else total
    if isinstance(total, (list, tuple)):
        return [_accumulate(t, g) for t, g in zip(total, grad, strict=True)]
    if total.shape != grad.shape:
        total = total.sum_to_size(grad.shape)
    return total + grad
'''.lstrip()

#: A sibling differentiator's gradient, as its backward returned it, summed to the
#: shape of the argument it belongs to (autodiff/vjp.py, REDUCE).
_REDUCE = '''
def _reduce(grad: Grad, shape: torch.Size) -> Grad:
    """`grad` summed to `shape`, as autograd's engine sums a gradient to its input's:
    a differentiator's backward may return it unreduced; None stays None."""
    return None if grad is None else grad.sum_to_size(shape)
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

    _base_apply: Any = torch._C._FunctionBase.__dict__["apply"]
except (ImportError, AttributeError, KeyError):
    _base_apply = None
_JVP = "s2sgrad jvp"  # the ctx attribute of forward mode, no name of the user's
#: Set while torch.func or forward mode differentiates the op: its Function's forward
#: sees the inputs without their `requires_grad`, so `_requires_grad` answers for them.
_differentiating = contextvars.ContextVar("s2sgrad differentiating", default=False)
_unpack_dual: Any = forward_ad.unpack_dual
_make_dual: Any = forward_ad.make_dual


def _apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """`function.apply(*args)`, with a `jvp` where forward mode may ask for one."""
    try:
        if torch.compiler.is_compiling():  # which traces no custom jvp
            return function.apply(*args)  # type: ignore[no-untyped-call]
        if _base_apply is None:
            return _with_jvp(function).apply(*args)
        transforms = _transforms_active()
        if transforms and "first_order" in vars(function.backward):
            _refuse_nesting(function)
        if not transforms and getattr(forward_ad, "_current_level", 0) < 0:
            return _base_apply.__get__(None, function)(*_unwrap(args))
        token = _differentiating.set(True)
        try:
            if transforms and _jvp_over_jvp(function):
                return _peeled(function, args)
            return _with_jvp(function).apply(*args)
        finally:
            _differentiating.reset(token)
    except (TypeError, AttributeError) as error:
        _number_for_tensor(function, args, error)
        raise


def _requires_grad(tensor: Tensor) -> bool:
    """`tensor.requires_grad`, as forward reads a parameter's: also True for a
    floating-point tensor while torch.func or forward mode differentiates the op."""
    return tensor.requires_grad or (
        _differentiating.get() and _differentiable(tensor)
    )


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


def _refuse_nesting(function: type[torch.autograd.Function]) -> None:
    """Raise where torch.func nests two derivatives around a first-order op."""
    keys = [str(i.key()) for i in _interpreters() or ()]
    if sum(k in ("TransformType.Grad", "TransformType.Jvp") for k in keys) > 1:
        raise RuntimeError(vars(function.backward)["first_order"])


def _jvp_over_jvp(function: type[torch.autograd.Function]) -> bool:
    """Tell whether torch.func nests forward mode in forward mode here, innermost. torch
    does not differentiate a Function's `jvp`, which would lose the second-order
    tangents: `_peeled` takes the innermost level itself. Forward mode over forward
    mode around reverse mode loses them where no level can be peeled: an error."""
    keys = [str(i.key()) for i in _interpreters() or ()]
    if keys.count("TransformType.Jvp") < 2:
        return False
    if keys[-1] != "TransformType.Jvp":
        raise NotImplementedError(
            f"`{function.__name__}`: torch.func forward mode over forward mode with "
            "reverse mode inside (jacfwd over jacfwd over grad, say) would lose "
            "second-order tangents of a custom Function; use jacfwd over jacrev"
        )
    return True


def _peeled(function: type[torch.autograd.Function], args: tuple[Any, ...]) -> Any:
    """`function.apply(*args)` under nested forward mode: the outer levels see the
    Function (its `jvp`), the innermost level's tangents are computed here, as torch
    code that the outer levels differentiate."""
    pairs = [_unpack_dual(a) if isinstance(a, Tensor) else None for a in args]
    primals = [a if p is None else p.primal for a, p in zip(args, pairs, strict=True)]
    tangents = tuple(None if p is None else p.tangent for p in pairs)
    output = _with_jvp(function).apply(*primals)
    if all(t is None for t in tangents):
        return output
    ctx = _Context()
    function.setup_context(ctx, tuple(primals), output)
    setattr(ctx, _JVP, _layout(tuple(primals), output))
    found = _transposed(function, ctx, tangents)
    duals = [
        o if t is None else _make_dual(o, t)
        for o, t in zip(_outputs(output), _outputs(found), strict=True)
    ]
    return tuple(duals) if isinstance(output, tuple) else duals[0]


class _Context:
    """A ctx for `setup_context` outside autograd: what it saves, its attributes."""

    saved_tensors: tuple[Tensor, ...] = ()
    needs_input_grad = None

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.saved_tensors = tensors

    def set_materialize_grads(self, value: bool) -> None:
        pass


def _layout(inputs: Context, output: Any) -> tuple[Any, ...]:
    """What `_transposed` needs to know of a call: the input tensors' shapes, each
    differentiable output's shape, dtype and device, and whether there are several."""
    shapes = [x.shape if isinstance(x, Tensor) else None for x in inputs]
    outputs = [
        (o.shape, o.dtype, o.device) if _differentiable(o) else None
        for o in _outputs(output)
    ]
    return shapes, outputs, isinstance(output, tuple)


@functools.cache
def _with_jvp(function: type[torch.autograd.Function]) -> Any:
    """`function` with a `jvp`: the transpose of its backward, so that forward mode
    gives the derivative the user's backward defines (a straight-through estimator's
    too). What backward reads is saved for forward mode as well."""

    def forward(*args: Any) -> Any:
        return _distinct(function.forward(*args), args)

    def setup_context(ctx: Any, inputs: Context, output: Any) -> None:
        function.setup_context(kept := _Kept(ctx), inputs, output)
        saved = kept.__dict__["s2sgrad saved"]
        ctx.save_for_backward(*saved)
        ctx.save_for_forward(*saved)
        setattr(ctx, _JVP, _layout(inputs, output))

    def backward(ctx: Any, *grads: Grad) -> Any:
        return function.backward(_Kept(ctx), *grads)

    def jvp(ctx: Any, *tangents: Grad) -> Any:
        return _distinct(_transposed(function, ctx, tangents), tangents)

    methods = (forward, setup_context, backward, jvp)
    own = {method.__name__: staticmethod(method) for method in methods}
    return type(function.__name__, (function,), own)


class _Kept:
    """The ctx that a Function's own methods see: what they save is kept aside (the
    runtime saves it for both modes), and forward mode asks for some gradients only.
    Its own state sits under keys no attribute name can spell, so every attribute
    the Function's context sets, `ctx.saved` or `ctx.ctx` included, stays the user's."""

    def __init__(self, ctx: Any, needs: tuple[bool, ...] | None = None) -> None:
        self.__dict__.update({"s2sgrad ctx": ctx, "s2sgrad saved": (), "s2sgrad needs": needs})

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.__dict__["s2sgrad saved"] = tensors

    @property
    def needs_input_grad(self) -> Any:
        return self.__dict__["s2sgrad needs"] or self.__dict__["s2sgrad ctx"].needs_input_grad

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["s2sgrad ctx"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["s2sgrad ctx"], name, value)


def _transposed(function: Any, ctx: Any, tangents: tuple[Grad, ...]) -> Any:
    """The output tangents `J t`, `J` the Jacobian that backward defines. Backward is
    linear in its gradients, `g -> J^T g`: `J t` is that map's vector-Jacobian product
    at `g = 0`, pulled back by `t`. Each gradient is summed to its input's shape first,
    as autograd's engine would."""
    shapes, outputs, several = getattr(ctx, _JVP)
    wrt = [i for i, t in enumerate(tangents) if t is not None and shapes[i] is not None]
    backward = getattr(function.backward, "__wrapped__", function.backward)
    kept = _Kept(ctx, tuple(i in wrt for i in range(len(tangents))))
    zeros = [torch.zeros(o[0], dtype=o[1], device=o[2]) for o in outputs if o]

    def gradients(*given: Tensor) -> tuple[Tensor, ...]:
        grads = iter(given)
        found = backward(kept, *(next(grads) if o else None for o in outputs))
        found = found if isinstance(found, tuple) else (found,)
        return tuple(
            (
                torch.zeros(shapes[i], dtype=tangents[i].dtype, device=tangents[i].device)  # type: ignore[union-attr]
                if found[i] is None
                else found[i].sum_to_size(shapes[i])
            )
            for i in wrt
        )

    found: Any = [None] * len(zeros)
    if wrt:
        pull = torch.func.vjp(gradients, *zeros)[1]
        found = pull(tuple(tangents[i] for i in wrt))
    out = iter(found)
    out_tangents = [next(out) if o else None for o in outputs]
    return tuple(out_tangents) if several else out_tangents[0]


def _distinct(outputs: Any, inputs: tuple[Any, ...]) -> Any:
    """`outputs`, each tensor its own: forward mode gives each output its own tangent,
    where the closure may return one tensor twice, and a tangent that the transpose of
    backward computes is no view, where an output may be an input or a view."""
    several = isinstance(outputs, tuple)
    seen = {id(x) for x in inputs if isinstance(x, Tensor)}
    found = []
    for o in outputs if several else (outputs,):
        if isinstance(o, Tensor) and (id(o) in seen or o._is_view()):
            o = o.clone()
        seen.add(id(o))
        found.append(o)
    return tuple(found) if several else found[0]


def _outputs(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


def _differentiable(value: Any) -> bool:
    return isinstance(value, Tensor) and (value.is_floating_point() or value.is_complex())
'''.lstrip()


#: The runtime of `policy=first-order` differentiators, before them: their Function's
#: backward is decorated with `_FirstOrder` when the class is defined.
FIRST_ORDER_RUNTIME = '''
# policy=first-order: a backward that answers first derivatives only.


class _FirstOrder:
    """Decorate the Function's backward under `policy=first-order`: its temporaries
    are saved, not promoted, so its derivative would be wrong. It runs without
    autograd, as `once_differentiable` does, and any second-order use raises instead
    of answering: autograd differentiating what it returned (its saved tensors count,
    where `once_differentiable` looks at the incoming gradients only), forward mode
    through it, or torch.func transforms nested around the op."""

    def __init__(self, name: str) -> None:
        self.message = (
            f"`{name}` was converted with policy=first-order: its backward saves "
            "temporaries without promoting them, so a second derivative through it "
            "would be wrong. Convert it with the default policy (promote) to "
            "differentiate it twice, or take first derivatives only"
        )

    def __call__(self, backward: Any) -> Any:
        message = self.message

        @functools.wraps(backward)
        def run(ctx: Any, *grads: Grad) -> Any:
            tensors = [g for g in grads if isinstance(g, Tensor)]
            tensors += ctx.saved_tensors
            if _forward_mode_through(tensors):
                raise RuntimeError(message)
            with torch.no_grad():
                found = backward(ctx, *grads)
            if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
                return found
            if _base_apply is not None and _transforms_active():
                return found  # nesting them is refused where the op runs: _apply
            several = isinstance(found, tuple)
            found = found if several else (found,)
            tracked = [t for t in tensors if t.requires_grad]  # the edges back
            refused = _Refuse.apply(message, len(found), *found, *tracked)  # type: ignore[no-untyped-call]
            return refused if several else refused[0]

        vars(run)["first_order"] = message  # which _apply reads
        return run


def _forward_mode_through(tensors: list[Tensor]) -> bool:
    """Tell whether forward mode would differentiate code that reads `tensors`."""
    if _base_apply is not None and _transforms_active():
        keys = [str(i.key()) for i in _interpreters() or ()]
        if "TransformType.Jvp" in keys:
            return True
    if getattr(forward_ad, "_current_level", -1) < 0:
        return False
    return any(_unpack_dual(t).tangent is not None for t in tensors)


class _Refuse(torch.autograd.Function):
    """Pass a first-order backward's gradients on, with the tensors they depend on as
    inputs, so that autograd reaches this node where anything differentiates them,
    and raises."""

    generate_vmap_rule = True

    @staticmethod
    def forward(message: str, count: int, *tensors: Grad) -> Any:
        return tuple(None if g is None else g.clone() for g in tensors[:count])

    @staticmethod
    def setup_context(ctx: Any, inputs: Context, output: Any) -> None:
        ctx.message = inputs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Grad) -> Any:
        raise RuntimeError(ctx.message)

    @staticmethod
    def jvp(ctx: Any, *tangents: Grad) -> Any:
        raise RuntimeError(ctx.message)
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
    if any(_reduces(item) for item in records):
        body.append(cst.parse_statement(_REDUCE))
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
    if any(item.first_order for item in records):  # decorates their Functions
        code = FIRST_ORDER_RUNTIME + "\n\n" + code
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


def _reduces(item: Differentiated) -> bool:
    """Whether the VJP blocks call `_reduce` (a sibling's gradient)."""
    call = m.Call(func=m.Name(REDUCE))
    blocks = item.gradients.blocks if item.gradients else ()
    return any(m.findall(block, call) for block in blocks)


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
        "import contextvars",
        "import functools",
        "import inspect",
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
    "_with_jvp",
    "_jvp_over_jvp",
    "_unpack_dual",
    "_differentiating",
    "_requires_grad",
    "_make_dual",
    "_FirstOrder",
    "_forward_mode_through",
    "_refuse_nesting",
    "_Refuse",
    "_peeled",
    "_Context",
    "_layout",
    "_transposed",
    "_Kept",
    "_JVP",
    "_outputs",
    "_distinct",
    "_differentiable",
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
    "_reduce",
    "_save",
    "_saved",
    SETITEM_NAME,
    *types.ALIASES,
)

#: Module-level names the generated code reads inside the functions that hold the
#: user's code (an accumulation, the op's apply, `math` in inlined rules): a parameter
#: or a local of the same name would hide them.
_SHADOWED = frozenset(
    {
        "_accumulate",
        "_reduce",
        "_apply",
        "_requires_grad",
        "_save",
        "_saved",
        SETITEM_NAME,
        "math",
    }
)

#: Names the generated module imports: the same objects are no collision.
_IMPORTED = {
    "Any": "from typing import Any",
    "cast": "from typing import cast",
    types.TENSOR: f"from torch import {types.TENSOR}",
    "functools": "import functools",
    "contextvars": "import contextvars",
    "inspect": "import inspect",
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
