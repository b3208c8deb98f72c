"""Property tests on random differentiators (tests/strategies.py), and their regressions.

For every drawn program: the transform succeeds, its output compiles and is black-stable,
the lifted pair (`f_forward`/`f_backward`, no autograd) reproduces the closure and its
backward (compared as autograd's engine sums a gradient returned unreduced), and the
generated op's outputs and gradients equal torch.autograd of the closure's own forward
in both shapes of DESIGN.md section 10: the pure orders 1, 2 and 3 (of random weighted
sums, some outputs left without gradient) and the mixed orders 2 and 3, where the loss
keeps the outputs and every gradient so far (a gradient penalty); and its tangents
under `forward_ad` equal reverse mode's, transposed. A separate test checks the generator
itself: the closure's hand-written backward equals torch.autograd of its forward, so a
wrong reference formula shows up there, not as an s2sgrad bug.

Environment: `S2SGRAD_HYPOTHESIS_EXAMPLES` (default 300) sets the number of examples;
`CI` derandomizes them, so a CI run is reproducible; `S2SGRAD_HYPOTHESIS_KNOWN_BUGS=1`
keeps the programs that hit a known bug; `S2SGRAD_HYPOTHESIS_PROGRESS=FILE` appends a
line per example to FILE, to follow a long run; `S2SGRAD_HYPOTHESIS_POLICY=recompute`
converts with that policy instead of the default `promote` (its gradients must be just as
right at every order). Every failure found is pinned below by a named regression test (a
strict xfail while the bug is open).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from hypothesis import HealthCheck, given, note, reject, settings
from hypothesis.errors import InvalidArgument
from oracle import gradients
from strategies import Param, Program, broadcast, programs

from s2sgrad import transform

EXAMPLES = int(os.environ.get("S2SGRAD_HYPOTHESIS_EXAMPLES", "300"))
IN_CI = bool(os.environ.get("CI"))
# Set to 1 to also run the programs that hit a known bug (see `KNOWN_BUG_ERRORS`)
# instead of discarding them: for checking a fix.
KNOWN_BUGS = os.environ.get("S2SGRAD_HYPOTHESIS_KNOWN_BUGS") == "1"
# A file to append one line per example to, to follow a long run (10,000 examples).
PROGRESS = os.environ.get("S2SGRAD_HYPOTHESIS_PROGRESS")
# The promotion policy of the generated-op property (`promote`, or `recompute`).
POLICY = os.environ.get("S2SGRAD_HYPOTHESIS_POLICY", "promote")
RTOL, ATOL = 1e-6, 1e-8

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=IN_CI,
    database=None if IN_CI else settings.default.database,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


# --------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------


def _note(text: str) -> None:
    """hypothesis.note inside a property; nothing in a plain (regression) test."""
    try:
        note(text)
    except InvalidArgument:
        pass


def _progress(test: str) -> None:
    if PROGRESS:
        with open(PROGRESS, "a") as f:
            f.write(f"{test}\n")


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    # Scale the absolute tolerance by the size of the values compared.
    scale = 1.0 + float(expected.detach().abs().max()) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual.detach(),
        expected.detach(),
        rtol=RTOL,
        atol=ATOL * scale,
        msg=lambda m: f"{what}: {m}",
    )


def exec_module(text: str, filename: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": filename.removesuffix(".py")}
    exec(compile(text, filename, "exec"), namespace)
    return namespace


def source_module(program: Program) -> dict[str, Any]:
    """Run the source as a module, importable as `program.module_name` if it has one
    (the generated module then imports a helper from it); see `forget_module`."""
    module = types.ModuleType(program.module_name or "gen")
    module.__file__ = "gen.py"
    exec(compile(program.source, "gen.py", "exec"), module.__dict__)
    if program.module_name:
        sys.modules[program.module_name] = module
    return module.__dict__


def forget_module(program: Program) -> None:
    if program.module_name:
        sys.modules.pop(program.module_name, None)


def generate(
    source: str, module_name: str | None = None, policy: str = "promote"
) -> str:
    """transform (whose guard, under tests/conftest.py, checks that the text compiles
    and is black-stable)."""
    return transform(source, "gen.py", module_name, policy=policy)


def outputs_of(program: Program, result: Any) -> list[Any]:
    """The top-level outputs of a result (a list output is one output)."""
    return [result] if program.n_outputs == 1 else list(result)


def flat(values: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors of outputs or gradients, lists flattened, in order."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, (list, tuple)):
            found += list(value)
        else:
            found.append(value)
    return found


def cotangents(program: Program, outputs: list[Any], salt: int) -> list[Any]:
    """Random cotangents shaped like the outputs (a list for a list output)."""
    weights = iter(program.weights([tuple(t.shape) for t in flat(outputs)], salt))
    return [
        (
            [next(weights) for _ in out]
            if isinstance(out, (list, tuple))
            else next(weights)
        )
        for out in outputs
    ]


def loss_pieces(program: Program, outputs: list[Any]) -> list[torch.Tensor]:
    """The output tensors a loss uses: the loss outputs, every other piece of a list."""
    used: list[torch.Tensor] = []
    for i in program.loss_outputs:
        out = outputs[i]
        used += list(out)[::2] if isinstance(out, (list, tuple)) else [out]
    return used


def entries(program: Program, returned: Any) -> tuple[Any, ...]:
    """A backward's result as one entry per parameter (a bare one included)."""
    if len(program.params) == 1:
        bare = not (
            isinstance(returned, tuple)
            and len(returned) == 1
            and not isinstance(returned[0], torch.Tensor)
            and program.params[0].kind == "tensors"
        )
        if program.params[0].kind != "tensors":
            return as_tuple(returned)
        return (returned,) if bare else returned
    return as_tuple(returned)


def param_gradients(program: Program, returned: Any) -> list[tuple[str, Any]]:
    """(name, gradient or None) per input tensor, lists element by element. A scalar
    parameter given a number has none (what backward returns there is dropped)."""
    found: list[tuple[str, Any]] = []
    for param, entry in zip(program.params, entries(program, returned), strict=True):
        if param.takes_tensor:
            found.append((param.name, entry))
        elif param.kind == "scalar":
            continue
        elif param.kind == "tensors":
            items = list(entry) if entry is not None else [None] * param.count
            assert len(items) == param.count, f"gradient of {param.name}: length"
            found += [(f"{param.name}[{i}]", g) for i, g in enumerate(items)]
        else:
            assert entry is None, f"gradient of {param.name}: not None"
    return found


def summed(grad: torch.Tensor, shape: Sequence[int], what: str) -> torch.Tensor:
    """`grad` summed to its input's `shape`, as autograd's engine does with a gradient
    returned unreduced; a shape the input does not broadcast to fails."""
    shape = torch.Size(shape)
    if grad.shape != shape:
        assert (
            broadcast(grad.shape, shape) == tuple(grad.shape)
        ), f"{what}: shape {tuple(grad.shape)} is not {tuple(shape)} broadcast"
        grad = grad.sum_to_size(shape)
    return grad


def split_result(returned: Any) -> tuple[Any, Any]:
    """(result, backward) of a closure: `return result, bw` or `return a, b, bw`."""
    *outs, backward = returned
    return (outs[0] if len(outs) == 1 else tuple(outs)), backward


def _weighted(
    values: Sequence[torch.Tensor], program: Program, salt: int
) -> torch.Tensor | float:
    """sum(w * v) over `values`, with the program's fixed weights for `salt`."""
    weights = program.weights([tuple(v.shape) for v in values], salt)
    return sum(((v * w).sum() for v, w in zip(values, weights, strict=True)), 0.0)


def grads(
    outputs: list[Any],
    tensors: list[torch.Tensor],
    program: Program,
    orders: int = 3,
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """(pure, mixed): gradients of random weighted sums, by torch.autograd.

    DESIGN.md section 10. Pure, orders 1..orders: order 1 of the loss
    L1 = sum(w_i * out_i) over the loss outputs (the others get no gradient), order
    k+1 of sum_j(v_j * g_j) over the order-k gradients g_j alone. Mixed, orders
    2..orders: the loss keeps every earlier term, L_k+1 = L_k + sum_j(v_j * g_j) over
    L_k's gradients (a gradient penalty: R1, WGAN-GP), so the op's backward receives its
    outputs' gradients and its temporaries' gradients in one call. Op and reference
    get the same weights (the program's, by salt).
    """
    if not tensors:
        return [[] for _ in range(orders)], [[] for _ in range(orders - 1)]
    loss = _weighted(loss_pieces(program, outputs), program, salt=1)
    first = gradients(loss, tensors)
    pure, current = [first], first
    for order in range(2, orders + 1):
        current = gradients(_weighted(current, program, salt=order), tensors)
        pure.append(current)
    mixed: list[list[torch.Tensor]] = []
    current = first
    for order in range(2, orders + 1):
        loss = loss + _weighted(current, program, salt=100 + order)
        current = gradients(loss, tensors)
        mixed.append(current)
    return pure, mixed


# Regressions found by this property test are pinned by the named tests below; the
# ones s2sgrad fixed run as plain tests, a known bug as a strict xfail.
#
# Known, unfixed bugs: error message -> their xfail regression test. The property test
# discards a program that raises one (unless S2SGRAD_HYPOTHESIS_KNOWN_BUGS=1), so that a
# known bug does not hide new ones. Remove the entry with the xfail when it is fixed.
KNOWN_BUG_ERRORS: dict[str, str] = {}


def _known_bug(error: Exception) -> None:
    if not KNOWN_BUGS and any(message in str(error) for message in KNOWN_BUG_ERRORS):
        reject()


def check_generated(program: Program, skip_known_bugs: bool = True) -> None:
    """The properties of the generated module for one program."""
    try:
        _check_generated(program)
    except Exception as error:
        if skip_known_bugs:
            _known_bug(error)
        raise
    finally:
        forget_module(program)


def _check_generated(program: Program) -> None:
    _note(f"source:\n{program.source}")  # readable, unlike the escaped repr
    text = generate(program.source, program.module_name, POLICY)
    _note(f"generated module:\n{text}")
    closure = source_module(program)[program.name]
    module = exec_module(text, "gen_grad.py")
    op = module[program.name]

    args, kwargs, tensors = program.inputs()
    ref_out, ref_backward = split_result(closure(*args, **kwargs))
    ref_outs = outputs_of(program, ref_out)
    assert len(ref_outs) == program.n_outputs

    # The lifted pair, without autograd, reproduces the closure and its backward.
    given = cotangents(program, ref_outs, salt=7)
    expected = param_gradients(program, ref_backward(*given))
    with torch.no_grad():
        result, ctx = module[f"{program.name}_forward"](*args, **kwargs)
        got = param_gradients(program, module[f"{program.name}_backward"](ctx, *given))
    for i, (a, b) in enumerate(
        zip(flat(outputs_of(program, result)), flat(ref_outs), strict=True)
    ):
        close(a, b, f"{program.name}_forward output {i}")
    assert len(got) == len(expected) == len(tensors)
    for (name, a), (_, b), t in zip(got, expected, tensors, strict=True):
        if b is None:
            assert a is None, f"{program.name}_backward entry {name}: expected None"
        else:
            # Either may be unreduced (PyTorch allows it): compared as autograd sums it.
            what = f"{program.name}_backward entry {name}"
            assert a is not None, f"{what}: got None"
            close(summed(a, t.shape, what), summed(b, t.shape, what), what)

    # The op: same outputs, of the same kinds, and the same gradients of orders 1 to 3.
    outs = outputs_of(program, op(*args, **kwargs))
    assert len(outs) == len(ref_outs)
    for a, b in zip(outs, ref_outs, strict=True):
        assert type(a) is type(b), f"output of type {type(a)}, not {type(b)}"
    for i, (a, b) in enumerate(zip(flat(outs), flat(ref_outs), strict=True)):
        close(a, b, f"output {i}")
    expected_pure, expected_mixed = grads(ref_outs, tensors, program)
    got_pure, got_mixed = grads(outs, tensors, program)
    names = [name for name, _ in expected]
    for shape, got_all, expected_all, first in (
        ("", got_pure, expected_pure, 1),
        ("mixed ", got_mixed, expected_mixed, 2),
    ):
        for order, (got_k, expected_k) in enumerate(
            zip(got_all, expected_all, strict=True), first
        ):
            for name, a, b in zip(names, got_k, expected_k, strict=True):
                close(a, b, f"{shape}order-{order} gradient of {name}")

    # Forward mode: the op's tangents are the closure forward's, under forward_ad.
    check_forward_mode(program, closure, op, args, kwargs, tensors)
    check_forward_over_reverse(program, op, args, kwargs, tensors)


def check_forward_mode(program, closure, op, args, kwargs, tensors) -> None:
    """Tangents of the op's outputs under forward_ad equal J t, the transpose of reverse
    mode through the closure's forward (DESIGN.md section 10: the op's jvp is the
    transpose of its backward, so forward mode agrees with reverse mode; forward_ad
    through the closure's forward would differ where it runs under `torch.no_grad()`).
    """
    if not tensors:
        return
    tangents = program.weights([tuple(t.shape) for t in tensors], salt=11)
    expected = reverse_tangents(program, closure, args, kwargs, tensors, tangents)
    with fwAD.dual_level():
        duals = {
            id(t): fwAD.make_dual(t.detach(), v)
            for t, v in zip(tensors, tangents, strict=True)
        }
        out = op(*substitute(list(args), duals), **substitute(dict(kwargs), duals))
        found = [fwAD.unpack_dual(o).tangent for o in flat(outputs_of(program, out))]
    assert len(found) == len(expected)
    for i, (a, b) in enumerate(zip(found, expected, strict=True)):
        if b is None:
            assert (
                a is None or not a.abs().any()
            ), f"tangent of output {i}: expected none"
        else:
            assert a is not None, f"tangent of output {i}: got none"
            close(a, b, f"tangent of output {i}")


def check_forward_over_reverse(program, op, args, kwargs, tensors) -> None:
    """The op's second derivative by forward mode over reverse (a Hessian-vector
    product as `hessian` and `jvp(grad(f))` take it) equals its reverse-over-reverse
    one, which the orders above compare with autograd of the closure's forward
    (DESIGN.md section 10: one derivative in every mode). Those orders are all
    reverse mode, so a value forward mode saw differently, a `torch.no_grad()`
    block recomputed in backward (no tangent stopped there), went unseen. Where
    backward runs the user's own closure through a helper of the source module
    (`inner_vjp`), its grad-off block is the user's code, run as torch runs it."""
    if not tensors or program.module_name and "no_grad()" in program.source:
        return
    tangents = program.weights([tuple(t.shape) for t in tensors], salt=13)

    def first(replacement: dict[int, Any], wrt: list[torch.Tensor]) -> list[Any]:
        call = op(
            *substitute(list(args), replacement),
            **substitute(dict(kwargs), replacement),
        )
        outs = outputs_of(program, call)
        return gradients(_weighted(loss_pieces(program, outs), program, salt=1), wrt)

    leaves_ = [t.detach().requires_grad_() for t in tensors]
    grads_ = first({id(t): v for t, v in zip(tensors, leaves_, strict=True)}, leaves_)
    dot = sum(((g * t).sum() for g, t in zip(grads_, tangents, strict=True)), 0.0)
    expected = gradients(dot, leaves_)
    with fwAD.dual_level():
        duals = [
            fwAD.make_dual(t.detach().requires_grad_(), v)
            for t, v in zip(tensors, tangents, strict=True)
        ]
        pairs = zip(tensors, duals, strict=True)
        found = [
            fwAD.unpack_dual(g).tangent
            for g in first({id(t): d for t, d in pairs}, duals)
        ]
    for i, (a, b) in enumerate(zip(found, expected, strict=True)):
        what = f"forward-over-reverse second derivative {i}"
        close(torch.zeros_like(b) if a is None else a, b, what)


def reverse_tangents(
    program: Program,
    closure: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    tensors: list[torch.Tensor],
    tangents: list[torch.Tensor],
) -> list[torch.Tensor | None]:
    """J t per output of the closure's forward, by reverse mode: the gradient w.r.t. v
    of <J^T v, t> (linear in v); None for an output that depends on no input."""
    outs = flat(outputs_of(program, split_result(closure(*args, **kwargs))[0]))
    wanted = [i for i, o in enumerate(outs) if o.requires_grad]
    if not wanted:
        return [None] * len(outs)
    vs = [torch.zeros_like(outs[i], requires_grad=True) for i in wanted]
    pulled = torch.autograd.grad(
        [outs[i] for i in wanted],
        tensors,
        vs,
        create_graph=True,
        allow_unused=True,
        materialize_grads=True,
    )
    dot = sum(((g * t).sum() for g, t in zip(pulled, tangents, strict=True)), 0.0)
    if isinstance(dot, torch.Tensor) and dot.requires_grad:
        pushed = torch.autograd.grad(
            dot, vs, allow_unused=True, materialize_grads=True
        )
    else:  # J^T v does not depend on v: J is zero
        pushed = tuple(torch.zeros_like(v) for v in vs)
    found: list[torch.Tensor | None] = [None] * len(outs)
    for i, jt in zip(wanted, pushed, strict=True):
        found[i] = jt
    return found


def substitute(value: Any, replacement: dict[int, Any]) -> Any:
    """`value` with each tensor in `replacement` (by id) replaced, lists included."""
    if isinstance(value, torch.Tensor):
        return replacement.get(id(value), value)
    if isinstance(value, list):
        return [substitute(v, replacement) for v in value]
    if isinstance(value, tuple):
        return tuple(substitute(v, replacement) for v in value)
    if isinstance(value, dict):
        return {k: substitute(v, replacement) for k, v in value.items()}
    return value


def check_closure(program: Program) -> None:
    """The generator's own backward equals torch.autograd of the closure's forward."""
    _note(f"source:\n{program.source}")
    closure = source_module(program)[program.name]
    forget_module(program)
    args, kwargs, tensors = program.inputs()
    out, backward = split_result(closure(*args, **kwargs))
    outs = outputs_of(program, out)
    given = cotangents(program, outs, salt=7)
    got = param_gradients(program, backward(*given))
    assert len(got) == len(tensors)
    if not tensors:
        return
    expected = torch.autograd.grad(
        flat(outs), tensors, flat(given), allow_unused=True, materialize_grads=True
    )
    for (name, value), ref in zip(got, expected, strict=True):
        value = value if value is not None else torch.zeros_like(ref)
        # Summed to the input's shape, as autograd's engine sums an unreduced gradient.
        value = summed(value, ref.shape, f"closure gradient of {name}")
        close(value, ref, f"closure gradient of {name}")


# --------------------------------------------------------------------------------------
# Properties.
# --------------------------------------------------------------------------------------


@SETTINGS
@given(programs())
def test_random_closure_backward_matches_autograd(program: Program) -> None:
    _progress("closure")
    check_closure(program)


@SETTINGS
@given(programs())
def test_random_program_generated_op_matches_autograd(program: Program) -> None:
    _progress("generated")
    check_generated(program)


# --------------------------------------------------------------------------------------
# Regressions: failures the properties found, shrunk to a minimal program.
# --------------------------------------------------------------------------------------


def T(name: str, *shape: int) -> Param:
    return Param(name, "tensor", tuple(shape))


def program(
    source: str,
    params: list[Param],
    n_outputs: int = 1,
    loss_outputs: list[int] | None = None,
    listed: list[bool] | None = None,
) -> Program:
    name = source.rsplit("\ndef ", 1)[1].split("(", 1)[0]  # the last one
    return Program(
        name,
        source,
        params,
        n_outputs,
        0,
        loss_outputs or list(range(n_outputs)),
        listed_outputs=listed or [],
    )


def check_regression(
    source: str, params: list[Param], n_outputs: int = 1, listed: list[bool] | None = None
) -> None:
    """Both properties on one fixed program, known bugs included."""
    prog = program(source, params, n_outputs, listed=listed)
    check_closure(prog)  # the program itself is right
    check_generated(prog, skip_known_bugs=False)


def test_regression_input_returned_as_output_and_saved() -> None:
    check_regression(
        """import torch

def f(x: torch.Tensor):
    t = x * x
    def backward(g1, g2):
        return g1 + 2.0 * x * g2
    return (x, t), backward
""",
        [T("x", 3)],
        n_outputs=2,
    )


def test_regression_input_returned_as_output_via_contiguous() -> None:
    check_regression(
        """import torch

def f(x: torch.Tensor):
    t = x.contiguous()
    def backward(grad):
        return grad * torch.ones_like(x)
    return t, backward
""",
        [T("x", 3)],
    )


def test_regression_flatten_of_1d_input_is_the_input_object() -> None:
    check_regression(
        """import torch

def f(x: torch.Tensor):
    h = torch.flatten(x)
    def backward(grad):
        return grad * 2.0 * h
    return h * h, backward
""",
        [T("x", 3)],
    )


def test_regression_sum_to_size_to_same_shape_is_the_input_object() -> None:
    check_regression(
        """import torch

def f(x: torch.Tensor):
    h = x.sum_to_size(2, 3)
    def backward(grad):
        return grad * 2.0 * h
    return h * h, backward
""",
        [T("x", 2, 3)],
    )


def test_regression_rebound_parameter_snapshot() -> None:
    check_regression(
        """import torch

def f(a: torch.Tensor):
    t = torch.sin(a)
    a = a * 2.0
    def backward(grad):
        return grad * (2.0 * t + a * torch.cos(a * 0.5))
    return a * t, backward
""",
        [T("a", 3)],
    )


def test_regression_backward_calls_sibling_differentiator() -> None:
    check_regression(
        """import torch


def inner(x: torch.Tensor):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2.0 * torch.cos(x)
    return t * 2.0, backward


def outer(a: torch.Tensor):
    u = inner(a)[0]
    v = u * u
    def backward(grad):
        g_u = grad * 2.0 * u
        return inner(a)[1](g_u)
    return v, backward
""",
        [T("a", 3)],
    )


@pytest.mark.parametrize(
    "computed",
    [
        pytest.param(
            "    t = torch.zeros_like(x)\n    for _step in range(4):\n        t = x * _step + t\n",
            id="loop",
        ),
        pytest.param(
            "    with torch.no_grad():\n        c = x * 0.0\n    t = x * 6.0 + c\n",
            id="with",
        ),
    ],
)
def test_regression_recompute_reads_rebound_parameter(computed: str) -> None:
    check_regression(
        f"""import torch


def f(x: torch.Tensor):
{computed}    x = x * 2.0
    def backward(grad):
        return 12.0 * grad * t
    return t * t, backward
""",
        [T("x", 4, 1)],
    )


def test_regression_conditionally_rebound_parameter_is_the_input() -> None:
    check_regression(
        """import torch


def f(x: torch.Tensor, *, flag: bool):
    if flag:
        x = x / 4.0
    def backward(grad):
        return grad * 2.0 * x * (0.25 if flag else 1.0), None
    return x * x, backward
""",
        [T("x", 3), Param("flag", "bool", value=False, keyword_only=True)],
    )


def test_regression_conditionally_rebound_parameter_returned_and_saved() -> None:
    check_regression(
        """import torch


def f(x: torch.Tensor, *, flag: bool):
    if flag:
        x = x * 2.0
    def backward(g1, g2):
        s = 2.0 if flag else 1.0
        return (g1 + 2.0 * x * g2) * s, None
    return (x, x * x), backward
""",
        [T("x", 3), Param("flag", "bool", value=False, keyword_only=True)],
        n_outputs=2,
    )


def test_regression_tuple_assignment_binds_the_input_object() -> None:
    """`t1, t2 = ..., k.sum_to_size(k.shape)`: t2 is k itself, returned and saved."""
    check_regression(
        """import torch


def layer(q: torch.Tensor, k: torch.Tensor, dim: int):
    t1, t2 = q * torch.exp(-torch.tanh(k)), k.sum_to_size((4, 1))
    def backward(g1, g2, g3):
        g_t1 = g2 + g3.sum_to_size(t1.shape) + g3.sum_to_size(t1.shape)
        g_q = (g_t1 / torch.exp(torch.tanh(k))).sum_to_size(q.shape)
        g_k = g1.expand(k.shape) - g_t1 * t1 * (1.0 - torch.tanh(k) ** 2)
        return g_q, g_k, None
    return (t2, t1, torch.add(t1, t1)), backward
""",
        [T("q", 4, 1), T("k", 4, 1), Param("dim", "int", value=0)],
        n_outputs=3,
    )


def test_regression_input_object_written_in_the_return() -> None:
    """`return (..., b.sum_to_size(b.shape)), backward`: that output is b itself."""
    check_regression(
        """import torch


def fused(a: torch.Tensor, b: torch.Tensor):
    forward = a / (1.0 + b * b)
    def backward(grad1, grad2):
        g_a = (grad1 / (1.0 + b * b)).sum_to_size(a.shape)
        g_b = grad2 - 2.0 * grad1 * a * b / (1.0 + b * b) ** 2
        return g_a, g_b
    return (forward, b.sum_to_size((2, 3))), backward
""",
        [T("a", 2, 3), T("b", 2, 3)],
        n_outputs=2,
    )


def test_regression_sibling_returns_the_input_object() -> None:
    """`t1, _ = block(result, ...)`: block's forward returns its input itself, so t1 is
    the input `result` of `fused`, returned as an output while `result` is saved."""
    check_regression(
        """import torch


def block(result: torch.Tensor, alpha: float, needs_input_grad: torch.Tensor):
    needs_input_grad_shape = result.sum_to_size(4, 1)
    def backward(g):
        return g.expand(result.shape), None, None
    return needs_input_grad_shape, backward


def fused(result: torch.Tensor, needs_input_grad: torch.Tensor, dim: int):
    t1, _ = block(result, 0.75, needs_input_grad)
    def backward(dout1, dout2):
        g_result = block(result, 0.75, needs_input_grad)[1](dout1)[0]
        return g_result, dout2, None
    return (t1, needs_input_grad), backward
""",
        [T("result", 4, 1), T("needs_input_grad", 2), Param("dim", "int", value=0)],
        n_outputs=2,
    )


def test_regression_recompute_replays_the_in_place_change_of_a_value_it_rebinds() -> (
    None
):
    """`hs6` is recomputed (a loop fills it); its replay rebinds `c3` in the tuple
    assignment, so `c3` cannot be passed in: the replay must keep `c3.mul_(0.5)` too.
    It dropped it, and backward read `c3` as ones (first-order gradient off by 2 %)."""
    check_regression(
        """import torch


def f(inp: torch.Tensor, *, alpha: float = 1.0, flag: bool = False, dim: int):
    t1 = inp @ inp.t()
    t1, c3 = t1 * alpha, torch.ones_like(inp)
    c3.mul_(0.5)
    t4 = t1 * torch.exp(-torch.tanh(c3))
    t5, hs6 = inp.cos(), [None] * 2
    for i in range(2):
        hs6[i] = torch.tanh(t4 * (i + 1.0))
    t7 = hs6[0] + sum(hs6[1:])
    def backward(g1, g2, g3):
        g_t4 = (g3) * sum((i + 1.0) * (1.0 - h * h) for i, h in enumerate(hs6))
        g_inp = -(g1 * inp.sin())
        g_t2 = g2 + ((g_t4 / torch.exp(torch.tanh(c3))).sum_to_size(t1.shape))
        g_t1 = g_t2 * alpha
        g_inp = g_inp + (g_t1 @ inp)
        g_inp = g_inp + (g_t1.t() @ inp)
        return g_inp, None, None, None
    return (t5, t1, t7), backward
""",
        [
            T("inp", 3, 3),
            Param("alpha", "float", value=1.5, keyword_only=True),
            Param("flag", "bool", value=False, keyword_only=True),
            Param("dim", "int", value=0, keyword_only=True),
        ],
        n_outputs=3,
    )


def test_regression_recompute_reads_a_rebound_parameter_without_gradient() -> None:
    """`bias` gets no gradient and forward rebinds it before the replayed statements:
    it is a leaf (its rebound value, saved), and was also passed as the parameter,
    which gave `fused_recompute(inp, bias, bias)` (generated code did not compile)."""
    check_regression(
        """import torch


def fused(inp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *, flag: bool = False, dim: int):
    bias = bias.add(bias)
    c2, hs3 = bias.detach(), [None] * 3
    for i in range(3):
        hs3[i] = torch.tanh(inp * (i + 1.0) + c2)
    forward, t5 = hs3[0] + sum(hs3[1:]), inp.softmax(dim)
    forward = forward / 4.0
    def backward(dout1s, dout2, dout3, dout4):
        g_t5 = torch.stack(dout1s)
        g_weight = torch.softmax(weight, dim) * (dout3 - (dout3 * torch.softmax(weight, dim)).sum(dim, keepdim=True))
        g_forward = dout4 / 4.0
        g_inp = dout2 + (t5 * (g_t5 - (g_t5 * t5).sum(dim, keepdim=True)))
        g_inp = g_inp + ((g_forward) * sum((i + 1.0) * (1.0 - h * h) for i, h in enumerate(hs3)))
        return g_inp, g_weight, None, None, None
    return (torch.unbind(t5), inp, weight.softmax(dim), forward), backward
""",
        [
            T("inp", 4, 2),
            T("weight", 4, 1),
            T("bias", 4, 1),
            Param("flag", "bool", value=True, keyword_only=True),
            Param("dim", "int", value=0, keyword_only=True),
        ],
        n_outputs=4,
        listed=[True, False, False, False],
    )


def test_regression_forward_mode_with_one_tensor_returned_twice() -> None:
    """Forward mode sets one tangent per output tensor: the jvp Function clones the
    second copy (torch asserted "Only inplace operations can re-set the forward grad").
    """
    check_regression(
        """import torch


def f(x: torch.Tensor):
    t = x * 2.0
    def backward(g1, g2, g3):
        return g1 * x.cos() + 2.0 * (g2 + g3)
    return (x.sin(), t, t), backward
""",
        [T("x", 2, 3)],
        n_outputs=3,
    )


def test_regression_forward_mode_with_a_detached_view_of_the_input() -> None:
    """`torch.detach(x)` carries no gradient (a probe in opfacts): a constant, saved and
    not returned, so forward mode never sees a view of the input without a tangent."""
    check_regression(
        """import torch


def f(inp: torch.Tensor):
    c1 = torch.detach(inp)
    def backward(g1, g2):
        return torch.cat(g1) + g2 @ c1
    return (torch.chunk(inp, 2), torch.matmul(inp, c1.T)), backward
""",
        [T("inp", 4, 3)],
        n_outputs=2,
    )


def test_regression_unreduced_gradient_of_a_broadcast_input_meets_a_promoted_temporary() -> (
    None
):
    """Backward returns y's gradient unreduced ((2, 3) for y (3,)), as PyTorch allows;
    at the mixed order 2 the generated backward added the promoted temporary t's
    contribution, already reduced to (3,), which broadcast and counted once per row."""
    check_regression(
        """import torch


def f(x: torch.Tensor, y: torch.Tensor):
    t = y - x
    def backward(grad):
        g_t = 2.0 * grad * t
        return (-g_t).sum_to_size(x.shape), g_t
    return t * t, backward
""",
        [T("x", 2, 1), T("y", 3)],
    )


@pytest.mark.parametrize("name", ["saved", "ctx", "needs"])
def test_regression_capture_named_like_an_attribute_of_the_runtimes_ctx(name: str) -> None:
    """`saved`, a size (not a tensor) that backward reads, travels as `ctx.saved`; where
    backward runs through the runtime's `_Kept` wrapper (inside a forward-mode dual
    level, and forward mode itself, whose jvp transposes backward), `ctx.saved` read
    `_Kept.saved`, the saved tensors: "returned an invalid gradient at index 1 - got []
    but expected shape compatible with [3, 1]", or a wrong tangent."""
    source = f"""import torch


def f(a: torch.Tensor, b: torch.Tensor):
    t = a * b
    {name} = torch.ops.aten._size_if_not_equal(b.size(), t.size())
    def backward(g):
        return (g * b).sum_to_size(a.shape), torch.ops.aten._grad_sum_to_size(g * a, {name})
    return t, backward
"""
    op = exec_module(generate(source), "gen_grad.py")["f"]
    a, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in [(1, 4), (3, 1)])
    expected = torch.autograd.grad((a * b).sum(), (a, b))
    with fwAD.dual_level():  # backward, with forward mode on beside it
        got = torch.autograd.grad(op(a, b).sum(), (a, b))
    for x, y, what in zip(got, expected, "ab", strict=True):
        close(x, y, f"gradient of {what} inside a dual level")
    check_regression(source, [T("a", 1, 4), T("b", 3, 1)])


def test_helper_returning_its_argument_is_returned_as_a_view() -> None:
    """Next to the bug above: a module-level helper may return its argument too."""
    source = """import torch


def same(v):
    return v


def f(x: torch.Tensor):
    t = same(x)
    def backward(g1, g2):
        return g1 + 2.0 * x * g2
    return (t, x * x), backward
"""
    prog = dataclasses.replace(
        program(source, [T("x", 3)], n_outputs=2), module_name="s2sgrad_regression_same"
    )
    check_closure(prog)
    check_generated(prog, skip_known_bugs=False)


def test_input_returned_as_output_not_saved() -> None:
    """Next to the bugs above, what works: an input returned as-is but never saved."""
    check_regression(
        """import torch

def f(x: torch.Tensor):
    t = x * 2.0
    def backward(g1, g2):
        return g1 + 2.0 * g2
    return (x, t), backward
""",
        [T("x", 3)],
        n_outputs=2,
    )


def test_regression_a_value_setup_context_computes_reads_a_parameter_it_renames() -> None:
    """`n3 = len(inputs.shape) + 1` was computed again in setup_context, where the
    parameter `inputs` is unpacked as `input_inputs` (an output is named `inputs`):
    UnboundLocalError. A parameter taken under another name keeps the value
    travelling."""
    check_regression(
        """import torch


def op(ctx: torch.Tensor, output: torch.Tensor, inputs: torch.Tensor, dim: int):
    t1 = torch.sum(ctx, dim)
    n3 = len(inputs.shape) + 1
    inputs = inputs / n3
    t5 = t1 * torch.exp(-torch.tanh(inputs))
    def backward(grad_1):
        e = torch.exp(-torch.tanh(inputs))
        g_t1 = (grad_1 * e).sum_to_size(t1.shape)
        g_in = (-grad_1 * t1 * e * (1.0 - torch.tanh(inputs) ** 2)).sum_to_size(inputs.shape)
        return g_t1.unsqueeze(dim % ctx.ndim).expand(ctx.shape), None, g_in / n3, None
    return t5, backward
""",
        [T("ctx", 1, 3), T("output", 1, 3), T("inputs", 3, 3), Param("dim", "int", value=0)],
    )


def test_regression_helper_result_changed_in_place() -> None:
    """`t5 = softsign(t4); t5 /= 4.0`: a module-level helper's result is read as a
    new tensor (its body is not read), so the augmented assignment is written out of
    place; a sharing check that took every call for a holder of its arguments
    refused it (S2S123)."""
    source = """import torch


def softsign(v):
    return v / (1.0 + torch.abs(v))


def f(inp: torch.Tensor, weight: torch.Tensor):
    m3 = inp < 0.0
    t4 = weight.where(m3, inp)
    t5 = softsign(t4)
    t5 /= 4.0
    def backward(dout):
        g_t5 = dout / 4.0
        g_t4 = g_t5 / (1.0 + torch.abs(t4)) ** 2
        g_weight = torch.where(m3, g_t4, 0.0)
        g_inp = torch.where(m3, 0.0, g_t4)
        return g_inp, g_weight
    return t5, backward
"""
    prog = dataclasses.replace(
        program(source, [T("inp", 3), T("weight", 3)]),
        module_name="s2sgrad_regression_softsign",
    )
    check_closure(prog)
    check_generated(prog, skip_known_bugs=False)


def test_regression_helper_rebinding_its_parameter_in_a_loop() -> None:
    """`t1 = cube_loop(result); t1 -= result`, where `cube_loop` starts `out = v` and
    rebinds it to `out * v` in a loop that surely runs: the helper hands back a new
    tensor. The first reading of helper bodies (bbdff8a) was blind to order, took
    `out` for `v` itself, and refused the augmented assignment (S2S123); the 10,000
    example run caught it after 460 examples."""
    source = """import torch


def cube_loop(v):
    out = v
    for _ in range(2):
        out = out * v
    return out


def f(inp: torch.Tensor, weight: torch.Tensor):
    t1 = cube_loop(inp)
    t1 -= inp
    t2 = t1 * weight
    def backward(dout):
        g_t1 = dout * weight
        g_inp = g_t1 * (3.0 * inp * inp - 1.0)
        return g_inp, dout * t1
    return t2, backward
"""
    prog = dataclasses.replace(
        program(source, [T("inp", 3), T("weight", 3)]),
        module_name="s2sgrad_regression_cube_loop",
    )
    check_closure(prog)
    check_generated(prog, skip_known_bugs=False)


def test_regression_tuple_assignment_pairs_each_name_with_its_value() -> None:
    """`c2, t3 = torch.detach(t1), t1 * 1.5` where `t1` views the input: 58fa3ed's
    check of names bound to a view of an input took `t3` for a view too (the whole
    right-hand side held one) and refused `t3[-1:, ...].mul_(2.0)` as changing the
    input (S2S103). Each name now gets its own part; the 10,000-example run caught
    it after 2,602 examples."""
    source = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t1 = x.reshape(-1)
    c2, t3 = torch.detach(t1), t1 * 1.5
    t3[-1:, ...].mul_(2.0)
    out = t3 * w
    def backward(g):
        scale = torch.full_like(t3, 1.5)
        scale[-1:] = 3.0
        return g * w * scale, g * t3
    return out, backward
"""
    prog = dataclasses.replace(
        program(source, [T("x", 3), T("w", 3)]),
        module_name="s2sgrad_regression_tuple_pairs",
    )
    check_closure(prog)
    check_generated(prog, skip_known_bugs=False)


@pytest.mark.parametrize("flag", [True, False])
def test_regression_a_branch_merge_that_may_be_the_input_is_returned_as_a_view(
    flag: bool,
) -> None:
    """`t2 = a; if not flag: t2 = torch.sigmoid(a)`: the VJP keeps `t2` after the
    `if` (`t2_2`), which is `a` itself where `flag` is true; it was returned as an
    extra output as is, and every backward raised torch's "An input that has been
    returned as-is as output is being saved for backward". A name ever bound to
    another's object is returned as a view at every version. Found by the
    10,000-example run (seed 2618); it fails on 65052cd too."""
    source = """import torch


def fused(a: torch.Tensor, flag: bool, dim: int, beta: float):
    t2 = a
    if not flag:
        t2 = torch.sigmoid(a)
    t3 = t2 - a
    t2 = t2 / torch.exp(torch.tanh(a))
    t5 = t2 * 2.5
    def backward(grad1, grad2):
        g_a_0 = grad2 * 2.5
        g_t2 = (g_a_0 / torch.exp(torch.tanh(a))).sum_to_size(t2.shape)
        g_a = -g_a_0 * t2 * (1.0 - torch.tanh(a) ** 2)
        g_t2 = g_t2 + ((grad1).sum_to_size(t2.shape))
        g_a = g_a + (-grad1)
        g_a = g_a + ((g_t2) if flag else (g_t2 * torch.sigmoid(a) * torch.sigmoid(-a)))
        return g_a, None, None, None
    return (t3, t5), backward
"""
    params = [
        T("a"),
        Param("flag", "bool", value=flag),
        Param("dim", "int", value=0),
        Param("beta", "float", value=0.5),
    ]
    prog = dataclasses.replace(
        program(source, params, n_outputs=2),
        module_name=f"s2sgrad_regression_merge_view_{flag}",
    )
    check_closure(prog)
    check_generated(prog, skip_known_bugs=False)
