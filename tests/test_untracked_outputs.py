"""Outputs without a gradient parameter (issue 24, point 4).

PyTorch's own TorchScript closures (torch/csrc/jit/runtime/symbolic_script.cpp) write
`topk`, `kthvalue` and `max_pool2d_with_indices` as `return values, indices, backward`
with `def backward(grad_output)`: one gradient parameter, because the indices are
integers. s2sgrad refused them (S2S107). Now the gradient parameters belong to the
floating-point outputs, in order, found at run time by dtype; integer and bool outputs
take none (autograd marks them non-differentiable itself). Where the count differs at
run time the op raises, naming the function, when backward runs; never a gradient
handed to the wrong output. What conversion can prove wrong is a located S2S107
(tests/bad_inputs: `arity_too_few_grads`, `multi_output_arity`, `untaken_list_output`).

The closures below are the three from symbolic_script.cpp in eager Python (its
`AD_index_select_backward` as a module-level helper, `torch.max_pool2d_with_indices`
through `F.max_pool2d_with_indices`, its backward through `torch.ops.aten`), then an
integer output before the floating one (with a promoted temporary), a bool mask, and an
output whose dtype is a parameter. Each is checked against torch.autograd through the
closure's own forward, float64, at orders 1 to 3, pure and mixed (tests/oracle.py),
with gradcheck and gradgradcheck, under torch.func, and as a `--standalone` module.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import assert_same, derivatives, leaves, tensors_in

from s2sgrad import transform
from s2sgrad.diagnostics import TransformError
from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.review.model import review

F64 = torch.float64
ROOT = Path(__file__).resolve().parent.parent
MODULE = "untracked_closures"

SOURCE = '''\
"""symbolic_script.cpp's closures with integer outputs, and constructs around them."""
from typing import List

import torch
import torch.nn.functional as F


def index_select_backward(grad, dim: int, indices, sizes: List[int], keepdim: bool):
    """AD_index_select_backward, in eager torch."""
    if not keepdim and len(sizes) > 0:
        grad = grad.unsqueeze(dim)
        indices = indices.unsqueeze(dim)
    return grad.new_zeros(sizes).scatter(dim, indices, grad)


def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    result0, result1 = torch.topk(self, k, dim, largest, sorted)
    self_size = self.size()
    def backward(grad_output):
        grad_self = index_select_backward(grad_output, dim, result1, self_size, True)
        return grad_self, None, None, None, None
    return result0, result1, backward


def kthvalue(self, k: int, dim: int, keepdim: bool):
    result0, result1 = torch.kthvalue(self, k, dim, keepdim)
    self_size = self.size()
    def backward(grad_output):
        grad_self = index_select_backward(grad_output, dim, result1, self_size, keepdim)
        return grad_self, None, None, None
    return result0, result1, backward


def max_pool2d_with_indices(
    self,
    kernel_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    ceil_mode: bool,
):
    output, indices = F.max_pool2d_with_indices(
        self, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True
    )
    def backward(grad_output):
        grad_self = torch.ops.aten.max_pool2d_with_indices_backward(
            grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
        )
        return grad_self, None, None, None, None, None
    return output, indices, backward


def sorted_tanh(x, w):
    h = torch.tanh(x * w)
    values, idx = torch.sort(h, dim=-1)
    def backward(grad_values):
        gh = torch.zeros_like(grad_values).scatter(-1, idx, grad_values) * (1 - h * h)
        return gh * w, gh * x
    return idx, values, backward


def relu_square(x):
    mask = x > 0
    y = x * x * mask
    def backward(grad_y):
        return 2 * grad_y * x * mask
    return y, mask, backward


def cast_pair(x, dtype: torch.dtype):
    y = x.sin()
    z = (x > 0).to(dtype)
    def backward(grad_y):
        return grad_y * x.cos(), None
    return y, z, backward


def counted(x):
    n = x.shape[-1]
    values, idx = x.max(dim=-1)
    def backward(grad_values):
        one_hot = torch.nn.functional.one_hot(idx, n).to(grad_values.dtype)
        return grad_values.unsqueeze(-1) * one_hot
    return values, n, idx, backward


def sin_cos(x):
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(grad_s):
        return grad_s * c
    return s, c, backward
'''

POOL = ([2, 2], [2, 2], [0, 0], [1, 1], False)

#: case -> (function, tensor shapes, the other arguments).
CASES: dict[str, tuple[str, tuple[tuple[int, ...], ...], tuple[Any, ...]]] = {
    "topk_largest": ("topk", ((3, 5),), (2,)),
    "topk_smallest_dim0": ("topk", ((4, 3),), (2, 0, False)),
    "kthvalue": ("kthvalue", ((3, 5),), (2, 1, False)),
    "kthvalue_keepdim": ("kthvalue", ((4, 3),), (3, 0, True)),
    "max_pool2d_with_indices": ("max_pool2d_with_indices", ((2, 3, 6, 6),), POOL),
    # w is shared by every row: its gradient comes back unreduced.
    "index_first": ("sorted_tanh", ((2, 4), (4,)), ()),
    "bool_mask": ("relu_square", ((3, 4),), ()),
    "dtype_bool": ("cast_pair", ((3, 4),), (torch.bool,)),
    "dtype_int64": ("cast_pair", ((3, 4),), (torch.int64,)),
    "number_and_index": ("counted", ((3, 5),), ()),
}


@pytest.fixture(scope="module")
def text() -> str:
    return transform(SOURCE, f"{MODULE}.py", MODULE)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, text: str) -> Iterator[Path]:
    """The source module and its generated module, importable."""
    path = tmp_path_factory.mktemp("untracked")
    (path / f"{MODULE}.py").write_text(SOURCE)
    (path / f"{MODULE}_grad.py").write_text(text)
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))
    for name in (MODULE, f"{MODULE}_grad"):
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def modules(folder: Path) -> tuple[Any, Any]:
    return importlib.import_module(MODULE), importlib.import_module(f"{MODULE}_grad")


def inputs(shapes: tuple[tuple[int, ...], ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=F64, generator=gen) for shape in shapes]


def function(text: str, name: str) -> str:
    """The source of one generated top-level definition."""
    start = text.index(f"\n{name}")
    end = text.find("\n\n\n", start + 1)
    return text[start : end if end >= 0 else len(text)]


# -- what is generated ------------------------------------------------------------------


def test_backward_takes_the_floating_point_outputs_gradients(text):
    """The Function has a slot per output and hands the closure's pair the gradients
    of the floating-point outputs, found at run time; f_backward keeps the closure's
    signature."""
    cls = function(text, "class TopkFunction")
    assert "ctx.outputs_like = _floating_likes(result0, result1)" in cls
    assert "def backward(ctx: Any, grad_result0: Grad, grad_result1: Grad" in cls
    assert "(grad_output,) = _floating_grads(" in cls
    assert '"topk", 1, ctx.outputs_like, grad_result0, grad_result1' in cls
    assert "_like = " not in cls.replace("outputs_like = ", "")
    assert "def topk_backward(ctx: Context, grad_output: Tensor) -> Any:" in text
    # A slot named like the closure's parameter is that parameter's gradient again.
    cls = function(text, "class ReluSquareFunction")
    assert "def backward(ctx: Any, grad_y: Grad, grad_mask: Grad) -> Any:" in cls
    assert "(grad_y,) = _floating_grads(" in cls


def test_outputs_without_a_parameter_keep_their_values_and_dtypes(modules):
    closures, generated = modules
    for case, (name, shapes, rest) in sorted(CASES.items()):
        values = inputs(shapes)
        want = closures.__dict__[name](*values, *rest)[:-1]
        got = generated.__dict__[name](*leaves(values), *rest)
        assert len(got) == len(want), case
        for a, b in zip(got, want, strict=True):
            if not isinstance(b, torch.Tensor):
                assert a == b, case
                continue
            assert a.dtype == b.dtype, case
            torch.testing.assert_close(a.detach(), b, msg=case)
            if not (b.is_floating_point() or b.is_complex()):
                assert not a.requires_grad and a.grad_fn is None, case


# -- numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_equals_autograd_through_the_closure_at_orders_1_to_3(modules, case):
    closures, generated = modules
    name, shapes, rest = CASES[case]
    values = inputs(shapes)
    expected = derivatives(
        lambda *t: closures.__dict__[name](*t, *rest)[:-1], leaves(values)
    )
    got = derivatives(lambda *t: generated.__dict__[name](*t, *rest), leaves(values))
    assert_same(got, expected, what=f"{case}: ")


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradcheck_and_gradgradcheck(modules, case):
    _, generated = modules
    name, shapes, rest = CASES[case]
    values = leaves(inputs(shapes))

    def floating(*t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # gradcheck differences every output numerically, which a bool one refuses.
        return tuple(tensors_in(generated.__dict__[name](*t, *rest)))

    assert torch.autograd.gradcheck(floating, values)
    assert torch.autograd.gradgradcheck(floating, values)


def test_an_integer_input_gives_integer_outputs_and_needs_no_backward(modules):
    """`topk` of an integer tensor: no floating-point output, no gradient, no error."""
    closures, generated = modules
    x = torch.randint(0, 100, (3, 5))
    for got, want in zip(generated.topk(x, 2), closures.topk(x, 2)[:-1], strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)


# -- the count, checked at run time -------------------------------------------------------


def test_a_floating_output_without_a_parameter_raises_naming_the_function(modules):
    """`(x > 0).to(dtype)` with a floating dtype is an output backward takes no gradient
    for: its backward raises, whichever outputs the loss reads; forward alone runs."""
    _, generated = modules
    x = inputs(((3, 4),))[0]
    with torch.no_grad():
        y, z = generated.cast_pair(x, F64)
    assert z.dtype == F64
    for loss in (lambda y, z: y.sum(), lambda y, z: (y * z).sum()):
        y, z = generated.cast_pair(x.clone().requires_grad_(), F64)
        with pytest.raises(RuntimeError, match=r"^`cast_pair`: its backward takes 1"):
            loss(y, z).backward()


def test_two_floating_outputs_and_one_parameter_raise_rather_than_guess(modules):
    """`return s, c, backward` with `def backward(grad_s)`: conversion cannot tell
    that `c` is floating, so the op says so when backward runs."""
    _, generated = modules
    x = inputs(((4,),))[0].requires_grad_()
    s, c = generated.sin_cos(x)
    with pytest.raises(RuntimeError) as caught:
        torch.autograd.grad(s.sum(), x)
    message = str(caught.value)
    assert "`sin_cos`" in message and "2 of its 2 outputs" in message
    assert "(outputs: 0, 1)" in message


@pytest.mark.parametrize("transform_", ["jacrev", "jacfwd"])
def test_the_mismatch_raises_under_torch_func_too(modules, transform_):
    """Forward mode transposes backward: the same check, the same message."""
    _, generated = modules
    x = inputs(((3, 4),))[0]
    jacobian = getattr(torch.func, transform_)
    with pytest.raises(RuntimeError, match=r"^`cast_pair`"):
        jacobian(lambda t: generated.cast_pair(t, F64)[0])(x)


@pytest.mark.parametrize(
    ("bad", "where", "words"),
    [
        ("arity_too_few_grads.py", (9, 9), "takes 0 gradients"),
        ("multi_output_arity.py", (13, 17), "`n` never is"),
        ("untaken_list_output.py", (12, 25), "`halves` cannot take one"),
    ],
)
def test_what_conversion_can_prove_is_a_located_s2s107(bad, where, words):
    source = (ROOT / "tests" / "bad_inputs" / bad).read_text()
    with pytest.raises(TransformError) as caught:
        transform(source, bad)
    (found,) = caught.value.diagnostics
    assert (found.code, (found.line, found.column)) == ("S2S107", where)
    assert words in found.message


# -- torch.func, standalone, review --------------------------------------------------------


@pytest.mark.parametrize(
    "transform_",
    ["jacrev", "jacfwd", "hessian", "jacfwd_jacrev", "jacrev_jacrev"],
)
@pytest.mark.parametrize("case", ["topk_largest", "index_first", "bool_mask"])
def test_torch_func_transforms_match_the_closure(modules, case, transform_):
    closures, generated = modules
    name, shapes, rest = CASES[case]
    values = inputs(shapes)
    argnums = tuple(range(len(values)))
    index = 1 if name == "sorted_tanh" else 0  # the floating-point output

    def make(fn: Any) -> Any:
        jacobian = fn
        for step in reversed(transform_.split("_")):
            jacobian = getattr(torch.func, step)(jacobian, argnums=argnums)
        return jacobian

    want = make(lambda *t: closures.__dict__[name](*t, *rest)[index])(*values)
    got = make(lambda *t: generated.__dict__[name](*t, *rest)[index])(*values)
    torch.testing.assert_close(got, want)


def test_vmap_batches_the_values_the_indices_and_their_gradients(modules):
    closures, generated = modules
    xs = inputs(((4, 3, 5),))[0]
    values, indices = torch.func.vmap(lambda t: generated.topk(t, 2))(xs)
    want = torch.func.vmap(lambda t: closures.topk(t, 2)[:-1])(xs)
    torch.testing.assert_close(values, want[0])
    assert indices.dtype == torch.int64 and torch.equal(indices, want[1])

    def loss(op: Any) -> Any:
        return torch.func.vmap(torch.func.grad(lambda t: op(t, 2)[0].sin().sum()))(xs)

    torch.testing.assert_close(
        loss(generated.topk), loss(lambda *a: closures.topk(*a)[:-1])
    )


_STANDALONE_RUN = """
import sys
sys.modules["s2sgrad"] = None  # `import s2sgrad` raises ImportError from here on
sys.path[:0] = [{folder!r}, {tests!r}]
import torch
from oracle import assert_same, derivatives, leaves
import {module} as closures
import {module}_standalone as generated

x = torch.randn(3, 5, dtype=torch.float64)
want = derivatives(lambda t: closures.topk(t, 2)[:-1], leaves([x]))
assert_same(derivatives(lambda t: generated.topk(t, 2), leaves([x])), want)
y, z = generated.cast_pair(x.requires_grad_(), torch.float64)
try:
    y.sum().backward()
except RuntimeError as error:
    print("ok", str(error).split(":")[0])
"""


def test_a_standalone_module_routes_and_checks_without_s2sgrad(folder):
    text = transform(SOURCE, f"{MODULE}.py", MODULE, standalone=True)
    assert "def _floating_grads(" in text and "def _floating_likes(" in text
    (folder / f"{MODULE}_standalone.py").write_text(text)
    code = _STANDALONE_RUN.format(
        folder=str(folder), tests=str(ROOT / "tests"), module=MODULE
    )
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok `cast_pair`", run.stdout


def test_review_shows_backward_with_the_closures_own_parameters():
    records = review(SOURCE, Origin(f"{MODULE}.py", MODULE), Options(), "out.py")
    record = next(r for r in records if r.name == "topk")
    backward = "\n".join(snippet.text for snippet in record.generated)
    assert "def topk_backward(ctx: Context, grad_output: Tensor) -> Any:" in backward
