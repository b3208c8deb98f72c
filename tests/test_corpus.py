"""The corpus of tests/corpus/: every differentiator converted and checked against autograd.

Each corpus module is converted once per test session (shared by pytest-xdist workers
through a file cache; see `Conversions`) and the generated module is executed from its
text by the module-scoped `generated` fixture, with the corpus module importable as
`tests.corpus.<name>` (tests/ is a namespace package; `pythonpath = ["."]`). Every case
is checked in float64 against torch.autograd of the closure's *own forward result* (the
source function's result differentiated by autograd, its hand-written backward unused):

* outputs and first, second and third order gradients of random weighted sums, each
  order alone and with the output and the earlier gradients in one loss (tests/oracle.py);
* torch.autograd.gradgradcheck of the generated op;
* torch.func.grad(torch.func.grad(...)) on one tensor input;
* torch.func.vmap over a leading batch dimension of one input (forward, and the
  per-sample gradient) equals a Python loop;
* torch.compile(fullgraph=True, backend="eager"): forward and first-order backward.

A meta-test checks that the corpus exercises every derivative rule of
s2sgrad/autodiff/rules.py in the forward computation of a promoted temporary.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import linecache
import os
import re
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libcst as cst
import pytest
import torch
from filelock import FileLock, Timeout
from libcst.metadata import (
    MetadataWrapper,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)
from oracle import assert_same, derivatives

from s2sgrad import transform
from s2sgrad.autodiff.rules import RULES
from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.pipeline import analyse

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
MODULES = sorted(
    p.stem
    for p in CORPUS_DIR.glob("*.py")
    if p.stem != "__init__" and not p.stem.endswith("_grad")  # in case one is written
)
F64 = torch.float64
RTOL, ATOL = 1e-7, 1e-9


# --------------------------------------------------------------------------------------
# Inputs.
# --------------------------------------------------------------------------------------


def r(*shape):
    return torch.randn(shape, dtype=F64)


def pos(*shape):
    return torch.rand(shape, dtype=F64) + 0.5


def idx(values):
    return torch.tensor(values, dtype=torch.long)


def bool_mask(*shape):
    return torch.rand(shape) > 0.5


def probs(*shape):
    return torch.softmax(r(*shape), dim=-1)


def one_hot(labels, classes):
    return torch.nn.functional.one_hot(idx(labels), classes).to(F64)


@dataclasses.dataclass(frozen=True)
class Case:
    module: str
    name: str
    id: str
    #: () -> (args, kwargs); called after torch.manual_seed(seed). Floating tensors are
    #: the differentiable inputs; integer and bool tensors are constants.
    factory: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]
    #: Which differentiable input (by position among them) vmap batches and
    #: torch.func.grad differentiates.
    focus: int = 0
    #: Part of the torch.compile subset.
    compile: bool = False
    #: An s2sgrad bug this case hits, the exception it raises (None: any) and the tests
    #: it fails (None: all).
    xfail: str | None = None
    xfail_raises: type[BaseException] | None = None
    xfail_tests: frozenset[str] | None = None


def case(module, name, id, factory, **kw):
    return Case(module, name, id, factory, **kw)


#: Regressions: cases that once hit s2sgrad bugs, kept in the corpus by name.
#: - indexing.first_chunk: `torch.split(x, k, dim=1)[0]` had the tensor getitem rule
#:   applied to the tuple split returns (now recomputed, with the reason in a comment);
#: - arithmetic.scaled_accumulation: `t = x + y; t *= x` snapshotted `t_0 = t` and then
#:   ran `t *= x` in place, so second order was wrong (now written out of place);
#: - conversions.cast_roundtrip, control.polynomial[no_shift]: a promoted temporary that
#:   is an input object itself was returned as-is and saved (now returned as a view).

#: Corpus modules that s2sgrad fails to convert, because of the bug named.
#: (statistics.py, which uses torch.var without importing math, was one until s2sgrad
#: learned to import what inlined rules read.)
UNCONVERTIBLE: dict[str, str] = {}

CASES = [
    # arithmetic
    case("arithmetic", "shifted_product", "same_shape", lambda: ((r(3, 4), r(3, 4)), {}), compile=True),
    case("arithmetic", "affine_square", "broadcast", lambda: ((r(3, 4), r(4), r(1, 4)), {}), compile=True),
    case("arithmetic", "quotient_square", "positive_y", lambda: ((r(3, 4), pos(3, 4)), {})),
    case("arithmetic", "power_mix", "positive_x", lambda: ((pos(3, 4), r(3, 4)), {}), compile=True),
    case("arithmetic", "scalar_operands", "default", lambda: ((r(3, 4),), {})),
    case("arithmetic", "scalar_operands", "alpha", lambda: ((r(3, 4),), {"alpha": 1.5})),
    case("arithmetic", "negated_difference", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("arithmetic", "accumulate_product", "same_shape", lambda: ((r(3, 4), r(3, 4)), {}), compile=True),
    case(
        "arithmetic", "scaled_accumulation", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("arithmetic", "paired_update", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("arithmetic", "exp_chain", "same_shape", lambda: ((r(3, 4), 0.5 * r(3, 4)), {})),
    case("arithmetic", "method_arithmetic", "positive_y", lambda: ((r(3, 4), pos(3, 4)), {})),
    # linalg
    case("linalg", "linear_tanh_rowsum", "dense", lambda: ((r(5, 3), r(3, 4), r(4)), {}), compile=True),
    case("linalg", "quadratic_form", "vector", lambda: ((r(4), r(4, 4)), {})),
    case("linalg", "projected_energy", "mm", lambda: ((r(5, 3), r(3, 4)), {})),
    case("linalg", "batched_bilinear", "bmm", lambda: ((r(2, 3, 4), r(2, 4, 5), r(2, 3, 5)), {})),
    # unary
    case("unary", "x_log_x", "positive", lambda: ((pos(3, 4),), {})),
    case("unary", "log_sum_exp_pair", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("unary", "log1p_of_expm1", "2d", lambda: ((r(3, 4),), {})),
    case("unary", "normalize_rows", "default_eps", lambda: ((r(3, 4),), {})),
    case("unary", "normalize_rows", "eps", lambda: ((r(3, 4),), {"eps": 0.1})),
    case("unary", "smooth_distance", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("unary", "signed_magnitude", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("unary", "sin_cos_product", "2d", lambda: ((r(3, 4),), {})),
    case("unary", "tanh_gate", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("unary", "erf_gelu", "2d", lambda: ((r(3, 4),), {}), compile=True),
    case("unary", "relu_square", "broadcast_bias", lambda: ((r(3, 4), r(4)), {})),
    case("unary", "clamp_product", "default", lambda: ((r(3, 4),), {})),
    case("unary", "clamp_product", "bounds", lambda: ((r(3, 4), -0.3, 0.8), {})),
    # selection
    case("selection", "leaky_where", "default", lambda: ((r(3, 4),), {}), compile=True),
    case("selection", "leaky_where", "slope", lambda: ((r(3, 4),), {"slope": 0.3})),
    case("selection", "blend", "mask", lambda: ((r(3, 4), r(3, 4), bool_mask(3, 4)), {})),
    case("selection", "max_min_energy", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    case(
        "selection", "masked_attention", "causal",
        lambda: ((r(3, 4), r(4, 2), torch.ones(3, 4, dtype=torch.bool).triu(1)), {}),
        compile=True,
    ),
    case("selection", "sign_agreement", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("selection", "band_mask", "default", lambda: ((r(3, 4), r(3, 4)), {})),
    case("selection", "band_mask", "band", lambda: ((r(3, 4), r(3, 4), -1.0, 0.2), {})),
    case("selection", "pick_row_max", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    # reductions
    case("reductions", "log1p_sum_squares", "rows", lambda: ((r(3, 4),), {})),
    case("reductions", "mean_center_square", "dim0", lambda: ((r(3, 4),), {})),
    case("reductions", "mean_center_square", "dim1", lambda: ((r(3, 4), 1), {})),
    case("reductions", "logsumexp_lastdim", "rows", lambda: ((r(3, 4),), {}), compile=True),
    case("reductions", "cross_entropy", "soft_targets", lambda: ((r(3, 4), probs(3, 4)), {})),
    case("reductions", "softmax_expectation", "default_tau", lambda: ((r(3, 4), r(3, 4)), {})),
    case("reductions", "softmax_expectation", "tau", lambda: ((r(3, 4), r(3, 4)), {"tau": 0.5})),
    # statistics
    case("statistics", "standardize", "rows", lambda: ((r(3, 5),), {}), compile=True),
    case("statistics", "variance_penalty", "all", lambda: ((r(3, 4), r(3, 4)), {})),
    # shapes
    case("shapes", "triangular_parts", "square", lambda: ((r(4, 4),), {})),
    case("shapes", "transposed_product", "2d", lambda: ((r(3, 4), r(4, 3)), {})),
    case("shapes", "outer_energy", "vectors", lambda: ((r(3), r(4)), {})),
    case("shapes", "permuted_projection", "3d", lambda: ((r(2, 3, 4), r(6)), {}), compile=True),
    case("shapes", "squeeze_flatten_view", "4d", lambda: ((r(2, 1, 3, 4), r(3, 4)), {})),
    case("shapes", "column_energy", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    # indexing
    case("indexing", "window_product", "slices", lambda: ((r(3, 5),), {}), compile=True),
    case("indexing", "concat_features", "dim1", lambda: ((r(3, 2), r(3, 4)), {})),
    case("indexing", "stacked_powers", "dim0", lambda: ((r(3, 4), r(3, 4)), {})),
    case("indexing", "split_gate", "halves", lambda: ((r(3, 4),), {})),
    case("indexing", "complex_magnitude", "pairs", lambda: ((r(3, 2),), {})),
    case("indexing", "select_rows", "repeated", lambda: ((r(4, 3), idx([2, 0, 2]), r(3)), {})),
    case("indexing", "gathered_log_likelihood", "targets", lambda: ((r(3, 4), idx([[1], [3], [0]])), {})),
    case("indexing", "index_accumulate", "default_alpha", lambda: ((r(4, 3), idx([1, 3, 1]), r(3, 3)), {})),
    case("indexing", "index_accumulate", "alpha", lambda: ((r(4, 3), idx([1, 3, 1]), r(3, 3), 0.5), {})),
    case(
        "indexing", "scatter_sine", "repeated",
        lambda: ((r(3, 5), idx([[0, 4], [2, 2], [1, 3]]), r(3, 2)), {}),
        compile=True,
    ),
    case("indexing", "narrow_window", "middle", lambda: ((r(3, 5), 1, 3), {})),
    case("indexing", "patch_columns", "cols_1_3", lambda: ((r(4, 5), r(4, 2)), {})),
    case("indexing", "tensor_indexed_rows", "repeated", lambda: ((r(4, 3), idx([3, 0, 3])), {})),
    case("indexing", "folded_blocks", "halves", lambda: ((r(3, 4),), {})),
    case("indexing", "moved_axis", "broadcast", lambda: ((r(3, 4), r(3)), {})),
    case("indexing", "first_chunk", "halves", lambda: ((r(3, 4),), {})),
    # conversions
    case("conversions", "detached_logsumexp", "rows", lambda: ((r(3, 4),), {})),
    case("conversions", "cast_roundtrip", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("conversions", "cast_copies", "same_shape", lambda: ((r(3, 4), r(3, 4)), {}), compile=True),
    case("conversions", "squared_hinge", "default", lambda: ((r(3, 4),), {})),
    case("conversions", "squared_hinge", "margin", lambda: ((r(3, 4),), {"margin": 0.25})),
    case("conversions", "saturating_square", "2d", lambda: ((r(3, 4),), {})),
    # nn
    case("nn", "gelu_scale", "exact", lambda: ((r(3, 4), r(4)), {})),
    case("nn", "gelu_scale", "tanh", lambda: ((r(3, 4), r(4)), {"approximate": "tanh"}), compile=True),
    case("nn", "softplus_weighted", "default", lambda: ((r(3, 4),), {})),
    case("nn", "softplus_weighted", "beta", lambda: ((r(3, 4), 2.0), {})),
    case("nn", "relu_mlp", "dense", lambda: ((r(5, 3), r(3, 4), r(4, 2)), {})),
    case("nn", "layer_norm_affine", "3d", lambda: ((r(2, 3, 5), r(5), r(5)), {})),
    case("nn", "attention", "batched", lambda: ((r(2, 2, 3), r(2, 3, 3), r(2, 3, 2)), {}), compile=True),
    case("nn", "nll_of_log_softmax", "one_hot", lambda: ((r(3, 4), one_hot([1, 3, 0], 4)), {})),
    # control
    case("control", "activation_square", "tanh", lambda: ((r(3, 4),), {})),
    case("control", "activation_square", "sigmoid", lambda: ((r(3, 4),), {"kind": "sigmoid"})),
    case("control", "scaled_residual", "default", lambda: ((r(3, 4), r(4)), {}), compile=True),
    case(
        "control", "scaled_residual", "keywords",
        lambda: ((r(3, 4), r(4)), {"scale": 0.5, "residual": False}), focus=1,
    ),
    case("control", "rebinding", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    case("control", "rotate", "broadcast", lambda: ((r(3, 4), r(4)), {}), focus=1),
    case("control", "two_heads", "dense", lambda: ((r(5, 3), r(3, 4), r(3, 2)), {}), compile=True),
    case("control", "moments", "last_dim", lambda: ((r(3, 4),), {})),
    case("control", "moments", "dim0", lambda: ((r(3, 4),), {"dim": 0})),
    case(
        "control", "polynomial", "no_shift", lambda: ((r(3, 4), [0.5, -1.0, 2.0]), {}),
    ),
    case("control", "polynomial", "shift", lambda: ((r(3, 4), [0.5, -1.0, 2.0]), {"shift": 0.3})),
]


#: Differentiators whose every case is an expected failure.
XFAIL_ONLY = {
    (c.module, c.name)
    for c in CASES
    if all(
        o.xfail and o.xfail_tests is None
        for o in CASES
        if (o.module, o.name) == (c.module, c.name)
    )
}


def params(test, only_compile=False):
    out = []
    for c in CASES:
        if only_compile and not c.compile:
            continue
        fails = c.xfail and (c.xfail_tests is None or test in c.xfail_tests)
        marks = (
            [pytest.mark.xfail(strict=True, raises=c.xfail_raises, reason=c.xfail)]
            if fails
            else []
        )
        out.append(pytest.param(c, id=f"{c.module}.{c.name}[{c.id}]", marks=marks))
    return out


# --------------------------------------------------------------------------------------
# Conversion, once per corpus module and policy per test session.
# --------------------------------------------------------------------------------------


class ConversionFailed(Exception):
    """s2sgrad rejected or failed on a corpus module (message of the original error)."""


class Conversions:
    """Generated module texts, each converted once per test session.

    Under pytest-xdist the workers share one directory (keyed by the run's id) and a
    file lock per text, so a module converted by one worker is read by the others.
    """

    def __init__(self, root: Path):
        self.root = root

    def _paths(self, module, policy):
        stem = self.root / f"{module}.{policy}"
        return Path(f"{stem}.py"), Path(f"{stem}.err"), Path(f"{stem}.lock")

    def _convert(self, module, policy, out, err):
        source = (CORPUS_DIR / f"{module}.py").read_text("utf-8")
        try:
            text = transform(
                source, f"tests/corpus/{module}.py", f"tests.corpus.{module}", policy=policy
            )
        except Exception as exc:  # reported to every worker alike
            err.write_text(f"{type(exc).__name__}: {exc}", "utf-8")
            return
        tmp = out.with_suffix(".tmp")
        tmp.write_text(text, "utf-8")
        tmp.replace(out)

    def text(self, module, policy="promote", wait=True):
        out, err, lock = self._paths(module, policy)
        try:
            with FileLock(str(lock), timeout=-1 if wait else 0):
                if not out.exists() and not err.exists():
                    self._convert(module, policy, out, err)
        except Timeout:  # another worker is converting it
            return None
        if err.exists():
            raise ConversionFailed(err.read_text("utf-8"))
        return out.read_text("utf-8")

    def prepare_all(self):
        """Convert every module, each worker starting at its own offset."""
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        start = (len(MODULES) * worker) // max(count, 1)
        order = MODULES[start:] + MODULES[:start]
        for wait in (False, True):
            for module in order:
                try:
                    self.text(module, wait=wait)
                except ConversionFailed:
                    pass


@pytest.fixture(scope="session")
def conversions(tmp_path_factory):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = tmp_path_factory.getbasetemp()
    if run:
        root = root.parent / f"s2sgrad-corpus-{run}"
    root.mkdir(parents=True, exist_ok=True)
    return Conversions(root)


@pytest.fixture(scope="module")
def generated(conversions):
    """Return get(module, policy="promote", edit=None) -> (text, namespace), cached.

    The generated text is executed as a real module object registered in sys.modules
    under `tests.corpus.<module>_grad...` (torch.compile looks functions' modules up
    there); nothing is written next to the corpus.
    """
    conversions.prepare_all()
    cache: dict[tuple[str, str, Any], tuple[str, dict[str, Any]]] = {}
    registered: list[str] = []

    def get(module, policy="promote", edit=None):
        key = (module, policy, edit)
        if key not in cache:
            text = conversions.text(module, policy)
            if edit is not None:
                text = edit(text)
            suffix = "" if policy == "promote" else "_" + policy.replace("-", "_")
            suffix += "" if edit is None else "_edited"
            name = f"tests.corpus.{module}_grad{suffix}"
            filename = str(CORPUS_DIR / f"{module}_grad{suffix}.py")  # never written
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            generated_module = types.ModuleType(name)
            generated_module.__file__ = filename
            sys.modules[name] = generated_module
            registered.append(name)
            exec(compile(text, filename, "exec"), generated_module.__dict__)
            cache[key] = (text, generated_module.__dict__)
        return cache[key]

    yield get
    for name in registered:
        sys.modules.pop(name, None)


def closure_of(c):
    return getattr(importlib.import_module(f"tests.corpus.{c.module}"), c.name)


def op_of(generated, c):
    return generated(c.module)[1][c.name]


# --------------------------------------------------------------------------------------
# Calling with the differentiable inputs replaced.
# --------------------------------------------------------------------------------------


def is_diff(v):
    return isinstance(v, torch.Tensor) and v.is_floating_point()


@dataclasses.dataclass
class Call:
    """A call's arguments with the slots of its differentiable tensors."""

    args: list[Any]
    kwargs: dict[str, Any]
    slots: list[tuple[str, Any]]

    @property
    def tensors(self):
        return [self.args[k] if kind == "a" else self.kwargs[k] for kind, k in self.slots]

    def __call__(self, fn, tensors):
        args, kwargs = list(self.args), dict(self.kwargs)
        for (kind, k), t in zip(self.slots, tensors, strict=True):
            if kind == "a":
                args[k] = t
            else:
                kwargs[k] = t
        return fn(*args, **kwargs)


def make_call(c, seed):
    torch.manual_seed(seed)
    args, kwargs = c.factory()
    slots = [("a", i) for i, a in enumerate(args) if is_diff(a)]
    slots += [("k", k) for k, v in kwargs.items() if is_diff(v)]
    return Call(list(args), dict(kwargs), slots)


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def leaves(tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def weighted(values, gen):
    """A scalar: the sum of each value times fixed random weights drawn from `gen`."""
    total = 0.0
    for v in values:
        total = total + (v * torch.randn(v.shape, dtype=v.dtype, generator=gen)).sum()
    return total


def grads_of(scalar, inputs, create_graph=True):
    """Gradients of `scalar` w.r.t. `inputs`, zeros where it does not depend on them."""
    if not (isinstance(scalar, torch.Tensor) and scalar.requires_grad):
        return [torch.zeros_like(t) for t in inputs]
    return list(
        torch.autograd.grad(
            scalar, inputs, create_graph=create_graph, allow_unused=True, materialize_grads=True
        )
    )


def close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------------------
# Tests per case.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("c", params("test_first_second_third_order_match_autograd"))
def test_first_second_third_order_match_autograd(generated, c):
    """Outputs and orders 1 to 3 equal autograd through the closure's own forward, in
    the pure shape and in the mixed one (output and gradients in one loss, as gradient
    penalties write it), where the op's backward receives the output's gradient and its
    temporaries' gradients in one call (DESIGN.md section 10)."""
    op = op_of(generated, c)
    call = make_call(c, seed=0)
    assert call.slots, "a case needs at least one differentiable input"
    got = derivatives(lambda *ts: call(op, ts), leaves(call.tensors))
    expected = derivatives(
        lambda *ts: call(lambda *a, **k: closure_of(c)(*a, **k)[0], ts),
        leaves(call.tensors),
    )
    assert_same(got, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c", params("test_gradgradcheck"))
def test_gradgradcheck(generated, c):
    op = op_of(generated, c)
    call = make_call(c, seed=1)
    tensors = tuple(leaves(call.tensors))
    # fast_mode checks random projections of the second derivatives; the exact ones are
    # compared with autograd in test_first_second_third_order_match_autograd.
    assert torch.autograd.gradgradcheck(lambda *ts: call(op, ts), tensors, fast_mode=True)


@pytest.mark.parametrize("c", params("test_func_grad_of_grad"))
def test_func_grad_of_grad(generated, c):
    """torch.func.grad twice (a Hessian-vector product) on the focus input."""
    op = op_of(generated, c)
    call = make_call(c, seed=2)
    base = [t.detach() for t in call.tensors]
    gen = torch.Generator().manual_seed(99)
    probe = as_tuple(call(op, base))
    w = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in probe]
    v = torch.randn(base[c.focus].shape, dtype=F64, generator=gen)

    def with_focus(fn, t):
        tensors = list(base)
        tensors[c.focus] = t
        return as_tuple(call(fn, tensors))

    def loss(t):
        return sum((o * wi).sum() for o, wi in zip(with_focus(op, t), w, strict=True))

    def directional(t):
        return (torch.func.grad(loss)(t) * v).sum()

    got = torch.func.grad(directional)(base[c.focus])

    t = base[c.focus].clone().requires_grad_()
    outs = with_focus(lambda *a, **k: closure_of(c)(*a, **k)[0], t)
    (g,) = grads_of(sum((o * wi).sum() for o, wi in zip(outs, w, strict=True)), [t])
    (expected,) = grads_of((g * v).sum(), [t], create_graph=False)
    close(got, expected, "grad(grad)")


def _batched(c, batch=3):
    """The call of seed 0 and the focus input stacked over `batch` seeds."""
    call = make_call(c, seed=0)
    stacked = torch.stack([make_call(c, seed=s).tensors[c.focus] for s in range(batch)])
    base = [t.detach() for t in call.tensors]
    return call, base, stacked


@pytest.mark.parametrize("c", params("test_vmap_equals_loop"))
def test_vmap_equals_loop(generated, c):
    op = op_of(generated, c)
    call, base, stacked = _batched(c)

    def single(t):
        tensors = list(base)
        tensors[c.focus] = t
        return as_tuple(call(op, tensors))

    got = torch.func.vmap(single)(stacked)
    loop = [single(t) for t in stacked]
    assert len(got) == len(loop[0])
    for i, g in enumerate(got):
        close(g, torch.stack([per[i] for per in loop]), f"vmapped output {i}")


@pytest.mark.parametrize("c", params("test_vmap_of_grad_equals_loop"))
def test_vmap_of_grad_equals_loop(generated, c):
    """Per-sample gradients: vmap(grad(loss)) over the focus input equals a loop."""
    op = op_of(generated, c)
    call, base, stacked = _batched(c)
    gen = torch.Generator().manual_seed(7)
    w = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in as_tuple(call(op, base))]

    def loss(t):
        tensors = list(base)
        tensors[c.focus] = t
        outs = as_tuple(call(op, tensors))
        return sum((o * wi).sum() for o, wi in zip(outs, w, strict=True))

    got = torch.func.vmap(torch.func.grad(loss))(stacked)
    expected = torch.stack([torch.func.grad(loss)(t) for t in stacked])
    close(got, expected, "vmapped gradient")


# torch.compile costs about a second per case even with the eager backend, so it runs on
# a representative subset (Case.compile: every corpus module, several outputs, keyword
# options, masks, index tensors, views, matmuls, tensor exponents).
@pytest.mark.slow
@pytest.mark.parametrize("c", params("test_torch_compile_fullgraph_matches_eager", only_compile=True))
def test_torch_compile_fullgraph_matches_eager(generated, c):
    op = op_of(generated, c)
    call = make_call(c, seed=3)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(lambda *ts: call(op, ts), fullgraph=True, backend="eager")
        eager_in, compiled_in = leaves(call.tensors), leaves(call.tensors)
        eager = as_tuple(call(op, eager_in))
        got = as_tuple(compiled(*compiled_in))
        assert len(got) == len(eager)
        for i, (a, b) in enumerate(zip(got, eager, strict=True)):
            close(a, b, f"compiled output {i}")
        g_eager = grads_of(weighted(eager, torch.Generator().manual_seed(5)), eager_in, False)
        g_comp = grads_of(weighted(got, torch.Generator().manual_seed(5)), compiled_in, False)
        for i, (a, b) in enumerate(zip(g_comp, g_eager, strict=True)):
            close(a, b, f"compiled gradient of tensor input {i}")
    finally:
        torch._dynamo.reset()


def test_compile_subset_covers_every_module():
    assert {c.module for c in CASES if c.compile} == set(MODULES) - set(UNCONVERTIBLE)
    assert len([c for c in CASES if c.compile]) >= 10


def test_every_corpus_differentiator_has_a_case():
    for module in MODULES:
        source = (CORPUS_DIR / f"{module}.py").read_text("utf-8")
        names = {d.name.value for d in _differentiators(cst.parse_module(source))}
        assert names <= {c.name for c in CASES if c.module == module}, module


# --------------------------------------------------------------------------------------
# Promotion is what makes second order right.
# --------------------------------------------------------------------------------------


def _without_the_first_order_guard(text):
    return "".join(
        line
        for line in text.splitlines(True)
        if not line.strip().startswith("@_FirstOrder(")
    )


def test_promotion_is_what_makes_second_order_right(generated):
    """shifted_product: t = a + b; r = t * b; backward reads t.

    With policy="first-order", t is saved but not promoted and backward is first-order
    only (`_FirstOrder`). Stripping that decorator lets a double backward run -- and it is
    silently wrong, because d(grad_b)/da through t = a + b is lost. The default policy
    (promotion) gets it right.
    """
    text, _ = generated("arithmetic", policy="first-order")
    assert '@_FirstOrder("shifted_product")' in text
    _, unsafe = generated("arithmetic", policy="first-order", edit=_without_the_first_order_guard)
    _, promoted = generated("arithmetic")
    closure = importlib.import_module("tests.corpus.arithmetic").shifted_product

    torch.manual_seed(0)
    a0, b0 = r(3, 4), r(3, 4)
    w, v = r(3, 4), r(3, 4)

    def second_order(fn):
        a, b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
        out = fn(a, b)
        ga, gb = torch.autograd.grad((out * w).sum(), (a, b), create_graph=True)
        return torch.autograd.grad((ga * v).sum() + (gb * v).sum(), (a, b), allow_unused=True,
                                   materialize_grads=True)

    expected = second_order(lambda a, b: closure(a, b)[0])
    right = second_order(promoted["shifted_product"])
    wrong = second_order(unsafe["shifted_product"])
    for g, e in zip(right, expected, strict=True):
        close(g, e, "promoted second order")
    # r = (a + b) * b: d2r/da db = 1 reaches a only through t; without promotion the
    # gradient w.r.t. a misses the v-weighted term from grad_b.
    assert not torch.allclose(wrong[0], expected[0])
    torch.testing.assert_close(wrong[0], torch.zeros_like(wrong[0]))
    torch.testing.assert_close(expected[0], w * v)


# --------------------------------------------------------------------------------------
# Meta-test: every derivative rule is exercised in a promoted temporary's computation.
# --------------------------------------------------------------------------------------
#
# How the scan works. For each corpus differentiator (a module-level def whose last
# statement is `return RESULT, NAME` with `NAME` a nested def):
#
# Differentiators whose cases all fail on a known s2sgrad bug (XFAIL_ONLY) and modules
# s2sgrad cannot convert (UNCONVERTIBLE) do not count.
#
# 1. The promoted temporaries are read from the generated module: the docstring of
#    `<name>_forward` lists each capture with its kind; those listed as
#    `temporary ...` are kept (and intersected with the names the source forward binds).
# 2. The forward statements those temporaries depend on are found by a reverse walk over
#    the forward body (backward data flow on names, branches of `if`/`else` merged,
#    tuple-literal unpacking paired element-wise, `t += x` keeping t live).
# 3. Each such statement's expression is scanned with libcst: binary/unary operators,
#    comparisons and subscripts map to `operator.*` names, calls to their libcst
#    qualified name when it starts with `torch.` (so `F.gelu` is
#    `torch.nn.functional.gelu`), and any other method call `v.m(...)` to
#    `torch.Tensor.m` (unless it is an imported module's function, like math.sqrt).
#    Subscripts of shapes and of non-tensor parameters are skipped.
# 4. A rule function is exercised when one of its RULES keys is among those names.
#    Rules with a differentiable entry must moreover be exercised on a statement that
#    the generated backward differentiates (it carries a `# line N: ...` comment in the
#    promoted-temporaries block), i.e. not only through the recompute fallback.

_BINARY = {
    cst.Add: "operator.add", cst.Subtract: "operator.sub", cst.Multiply: "operator.mul",
    cst.Divide: "operator.truediv", cst.Power: "operator.pow",
    cst.MatrixMultiply: "operator.matmul", cst.BitAnd: "operator.and_",
    cst.BitOr: "operator.or_", cst.BitXor: "operator.xor",
}
_AUGMENTED = {
    cst.AddAssign: "operator.add", cst.SubtractAssign: "operator.sub",
    cst.MultiplyAssign: "operator.mul", cst.DivideAssign: "operator.truediv",
    cst.PowerAssign: "operator.pow", cst.MatrixMultiplyAssign: "operator.matmul",
}
_UNARY = {cst.Minus: "operator.neg", cst.BitInvert: "operator.invert"}
_COMPARE = {
    cst.Equal: "operator.eq", cst.NotEqual: "operator.ne", cst.LessThan: "operator.lt",
    cst.LessThanEqual: "operator.le", cst.GreaterThan: "operator.gt",
    cst.GreaterThanEqual: "operator.ge",
}


def _differentiators(module):
    for statement in module.body:
        if not isinstance(statement, cst.FunctionDef):
            continue
        body = list(statement.body.body)
        last = body[-1] if body else None
        if not (
            isinstance(last, cst.SimpleStatementLine)
            and isinstance(last.body[0], cst.Return)
            and isinstance(last.body[0].value, cst.Tuple)
            and len(last.body[0].value.elements) == 2
        ):
            continue
        backward = last.body[0].value.elements[1].value
        if isinstance(backward, cst.Name) and any(
            isinstance(s, cst.FunctionDef) and s.name.value == backward.value for s in body
        ):
            yield statement


class _Ops(cst.CSTVisitor):
    """Collect the qualified names of the operations in one expression."""

    def __init__(self, qualified, non_tensor):
        self.qualified = qualified
        self.non_tensor = non_tensor
        self.ops = set()

    def visit_BinaryOperation(self, node):
        self.ops.add(_BINARY.get(type(node.operator), ""))

    def visit_UnaryOperation(self, node):
        self.ops.add(_UNARY.get(type(node.operator), ""))

    def visit_Comparison(self, node):
        self.ops.update(_COMPARE.get(type(t.operator), "") for t in node.comparisons)

    def visit_Subscript(self, node):
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "shape":
            return
        if isinstance(value, cst.Name) and value.value in self.non_tensor:
            return
        self.ops.add("operator.getitem")

    def visit_Call(self, node):
        found = self.qualified.get(node.func, ())
        found = found() if callable(found) else found
        torch_names = {q.name for q in found if q.name.startswith("torch.")}
        if torch_names:
            self.ops.update(torch_names)
        elif any(q.source == QualifiedNameSource.IMPORT for q in found):
            return  # a function of another module: math.sqrt(...)
        elif isinstance(node.func, cst.Attribute):
            self.ops.add(f"torch.Tensor.{node.func.attr.value}")


def _targets(target):
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _targets(e.value)]
    return []


def _reads(node):
    return {n.value for n in _find_names(node)}


def _find_names(node):
    found = []

    class V(cst.CSTVisitor):
        def visit_Name(self, n):
            found.append(n)

        def visit_Attribute(self, n):
            n.value.visit(self)
            return False

        def visit_Arg(self, n):
            n.value.visit(self)
            return False

    node.visit(V())
    return found


def _slice_ops(statements, live, visit):
    """Reverse data flow: call visit(expr, line) for every expression `live` needs."""
    for statement in reversed(statements):
        if isinstance(statement, cst.If):
            body = set(live)
            _slice_ops(list(statement.body.body), body, visit)
            orelse = set(live)
            if statement.orelse is not None:
                _slice_ops(list(statement.orelse.body.body), orelse, visit)
            live.clear()
            live.update(body | orelse)
            continue
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in reversed(statement.body):
            pairs = []
            if isinstance(small, cst.Assign):
                for t in small.targets:
                    tgt, value = t.target, small.value
                    if (
                        isinstance(tgt, (cst.Tuple, cst.List))
                        and isinstance(value, (cst.Tuple, cst.List))
                        and len(tgt.elements) == len(value.elements)
                    ):
                        pairs += [
                            (_targets(a.value), b.value)
                            for a, b in zip(tgt.elements, value.elements, strict=True)
                        ]
                    else:
                        pairs.append((_targets(tgt), value))
                hits = [(names, value) for names, value in pairs if set(names) & live]
                for names, _ in pairs:
                    live.difference_update(names)
                for _, value in hits:
                    visit(value, statement, None)
                    live.update(_reads(value))
            elif isinstance(small, cst.AugAssign):
                names = _targets(small.target)
                if set(names) & live:
                    visit(small.value, statement, _AUGMENTED.get(type(small.operator)))
                    live.update(_reads(small.value))


def _promoted(module, name, bound):
    """The promoted temporaries of one differentiator, from the engine's own records."""
    source = (CORPUS_DIR / f"{module}.py").read_text("utf-8")
    _, lifted = analyse(source, Origin(f"{module}.py", f"corpus.{module}"), Options())
    (item,) = [item for item in lifted if item.source.name == name]
    return {s.source for s in item.context if s.kind == "temporary" and s.promoted} & bound


def _differentiated_lines(text, name):
    match = re.search(rf"def {name}_backward\(.*?(?=\n(?:def|class) )", text, flags=re.S)
    assert match, f"no {name}_backward in the generated module"
    return {int(n) for n in re.findall(r"# [Ll]ine (\d+):", match.group(0))}


def corpus_rule_usage(generated):
    """Return {rule function name: set of (module.function, line, differentiated)}."""
    key_to_rule = {k: f.__name__ for k, f in RULES.items()}
    usage: dict[str, set[tuple[str, int, bool]]] = {}
    for module in MODULES:
        source = (CORPUS_DIR / f"{module}.py").read_text("utf-8")
        if module in UNCONVERTIBLE:
            with pytest.raises(ConversionFailed):
                generated(module)
            continue
        text, _ = generated(module)
        wrapper = MetadataWrapper(cst.parse_module(source))
        qualified = wrapper.resolve(QualifiedNameProvider)
        positions = wrapper.resolve(PositionProvider)
        for fn in _differentiators(wrapper.module):
            name = fn.name.value
            if (module, name) in XFAIL_ONLY:
                continue  # its cases fail on a known s2sgrad bug: not counted
            non_tensor = {
                p.name.value
                for p in [*fn.params.params, *fn.params.kwonly_params]
                if p.annotation is not None
                and "Tensor" not in cst.Module([]).code_for_node(p.annotation.annotation)
            }
            body = [
                s for s in fn.body.body[:-1] if not isinstance(s, cst.FunctionDef)
            ]
            bound = set()
            for s in body:
                for node in _find_assign_targets(s):
                    bound.update(_targets(node))
            live = _promoted(module, name, bound)
            if not live:
                continue
            vjp_lines = _differentiated_lines(text, name)

            def visit(
                expr, statement, extra, where=f"{module}.{name}", vjp_lines=vjp_lines,
                qualified=qualified, non_tensor=non_tensor, positions=positions,
            ):
                collector = _Ops(qualified, non_tensor)
                expr.visit(collector)
                ops = collector.ops | ({extra} if extra else set())
                line = positions[statement].start.line
                for op in ops:
                    if op in key_to_rule:
                        usage.setdefault(key_to_rule[op], set()).add(
                            (where, line, line in vjp_lines)
                        )

            _slice_ops(body, set(live), visit)
    return usage


def _find_assign_targets(statement):
    found = []

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, n):
            found.append(n.target)

        def visit_AugAssign(self, n):
            found.append(n.target)

    statement.visit(V())
    return found


def _has_gradient(rule):
    """Whether a rule's backward returns a gradient (anything but a literal None) for
    some parameter, read from the rule's own source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(rule)))
    backward = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n is not tree.body[0])
    returned = backward.body[-1].value
    entries = returned.elts if isinstance(returned, ast.Tuple) else [returned]
    return any(not (isinstance(e, ast.Constant) and e.value is None) for e in entries)


def test_every_rule_is_exercised_by_a_promoted_temporary(generated):
    usage = corpus_rule_usage(generated)
    rules = {f.__name__: f for f in RULES.values()}
    missing = sorted(r for r in rules if r not in usage)
    assert not missing, f"rules no corpus temporary exercises: {missing}"
    not_differentiated = sorted(
        r for r, f in rules.items()
        if _has_gradient(f) and not any(diff for _, _, diff in usage[r])
    )
    assert not not_differentiated, (
        f"rules only reached through recompute, never through a generated VJP: "
        f"{not_differentiated}"
    )
