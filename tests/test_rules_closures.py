"""Check every derivative rule in s2sgrad.autodiff.rules.

* format: each rule has the closure shape the frontend inlines, its backward reads
  only allowed names and is built from operations that have rules themselves;
* orders 1 and 2: each gradient entry, extracted on its own the way the generator
  keeps only the entries it needs, matches torch.autograd, at order 2 both alone and
  with the output in the same loss (the mixed shape of tests/oracle.py);
* registry: every qualified name resolves to a real PyTorch callable that agrees
  with the rule's forward on at least one example; VARARGS spellings bind.
"""

import ast
import builtins
import copy
import functools
import importlib
import inspect
import math
import re
import textwrap

import pytest
import torch
from oracle import assert_same, closure_op, derivatives
from oracle import leaves as fresh_leaves

from s2sgrad import opfacts, runtime
from s2sgrad.autodiff import rules
from s2sgrad.autodiff.rules import RULES, VARARGS

RTOL, ATOL = 1e-7, 1e-9
F64 = torch.float64
#: What rules may call besides torch, math and builtins: the runtime helpers rules.py
#: imports, which generated modules import too.
RUNTIME_HELPERS = {
    name: value for name, value in vars(rules).items() if name in vars(runtime)
    and name.startswith("_") and callable(value)
}


def r(*shape):
    return torch.randn(shape, dtype=F64)


def pos(*shape):
    return torch.rand(shape, dtype=F64) + 0.5


def _with_zeros(*shape):
    x = r(*shape)
    x.view(-1)[::3] = 0.0
    return x


def _zero_or_over_two(*shape):
    e = _with_zeros(*shape)
    return torch.where(e == 0, 0.0, e.abs() + 2.0)


def mask(*shape):
    return torch.rand(shape) > 0.5


def idx(*values):
    return torch.tensor(values, dtype=torch.long)


def _ties():
    a = r(3, 4)
    b = a.clone()
    b[0] += 1.0
    b[2, :2] -= 1.0
    return a, b


# (rule, id, factory) -- factory() -> (args, kwargs); called after torch.manual_seed.
EXAMPLES = [
    # arithmetic
    ("add", "same", lambda: ((r(3, 4), r(3, 4)), {})),
    ("add", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("add", "broadcast_both", lambda: ((r(3, 1), r(1, 4)), {})),
    ("add", "scalar_left", lambda: ((2.0, r(3)), {})),
    ("add", "scalar_right", lambda: ((r(3), 3.0), {})),
    ("add", "zero_dim", lambda: ((r(), r(3)), {})),
    ("sub", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("sub", "broadcast_both", lambda: ((r(2, 1, 4), r(3, 1)), {})),
    ("sub", "scalar_left", lambda: ((1.5, r(3)), {})),
    ("sub", "scalar_right", lambda: ((r(3), 0.5), {})),
    ("mul", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("mul", "broadcast_both", lambda: ((r(3, 1), r(1, 4)), {})),
    ("mul", "scalar_left", lambda: ((2.5, r(3)), {})),
    ("mul", "scalar_right", lambda: ((r(3, 2), -3.0), {})),
    ("div", "broadcast", lambda: ((r(3, 4), pos(4)), {})),
    ("div", "broadcast_both", lambda: ((r(3, 1), pos(1, 4)), {})),
    ("div", "scalar_left", lambda: ((2.0, pos(3)), {})),
    ("div", "scalar_right", lambda: ((r(3), 4.0), {})),
    ("neg", "2d", lambda: ((r(3, 4),), {})),
    ("pow_", "scalar_exponent", lambda: ((pos(3, 4), 2.5), {})),
    ("pow_", "int_exponent", lambda: ((r(3, 4), 3), {})),
    ("pow_", "scalar_base", lambda: ((2.0, r(3, 4)), {})),
    ("pow_", "tensor_both", lambda: ((pos(3, 4), r(3, 4)), {})),
    ("pow_", "broadcast", lambda: ((pos(3, 1), r(4)), {})),
    ("pow_", "kw_exponent", lambda: ((pos(3),), {"exponent": r(3)})),
    # Zeros where PyTorch's pow_backward special-cases them (nan here once).
    ("pow_", "zero_exponent", lambda: ((_with_zeros(3, 4), 0), {})),
    ("pow_", "zero_in_tensor_exponent", lambda: ((pos(3, 4), _zero_or_over_two(3, 4)), {})),
    # matrix products
    ("matmul", "vec_vec", lambda: ((r(3), r(3)), {})),
    ("matmul", "vec_mat", lambda: ((r(3), r(3, 4)), {})),
    ("matmul", "mat_vec", lambda: ((r(2, 3), r(3)), {})),
    ("matmul", "mat_mat", lambda: ((r(2, 3), r(3, 4)), {})),
    ("matmul", "batch_mat", lambda: ((r(5, 2, 3), r(3, 4)), {})),
    ("matmul", "mat_batch", lambda: ((r(2, 3), r(5, 3, 4)), {})),
    ("matmul", "batch_broadcast", lambda: ((r(5, 1, 2, 3), r(4, 3, 2)), {})),
    ("matmul", "vec_batch", lambda: ((r(3), r(5, 3, 4)), {})),
    ("matmul", "batch_vec", lambda: ((r(5, 2, 3), r(3)), {})),
    ("mm", "2d", lambda: ((r(2, 3), r(3, 4)), {})),
    ("bmm", "3d", lambda: ((r(5, 2, 3), r(5, 3, 4)), {})),
    # unary
    ("exp", "2d", lambda: ((r(3, 4),), {})),
    ("log", "2d", lambda: ((pos(3, 4),), {})),
    ("log1p", "2d", lambda: ((pos(3, 4),), {})),
    ("expm1", "2d", lambda: ((r(3, 4),), {})),
    ("sqrt", "2d", lambda: ((pos(3, 4),), {})),
    ("rsqrt", "2d", lambda: ((pos(3, 4),), {})),
    ("abs_", "2d", lambda: ((r(3, 4),), {})),
    ("sin", "2d", lambda: ((r(3, 4),), {})),
    ("cos", "2d", lambda: ((r(3, 4),), {})),
    ("tanh", "2d", lambda: ((r(3, 4),), {})),
    ("sigmoid", "2d", lambda: ((r(3, 4),), {})),
    ("erf", "2d", lambda: ((r(3, 4),), {})),
    ("relu", "2d", lambda: ((r(3, 4),), {})),
    ("gelu", "none", lambda: ((r(3, 4),), {})),
    ("gelu", "tanh", lambda: ((r(3, 4),), {"approximate": "tanh"})),
    ("gelu", "none_kw", lambda: ((3.0 * r(3, 4),), {"approximate": "none"})),
    ("softplus", "default", lambda: ((r(3, 4),), {})),
    (
        "softplus",
        "beta_threshold",
        lambda: ((r(3, 4),), {"beta": 2.0, "threshold": 1.0}),
    ),
    ("clamp", "both", lambda: ((r(3, 4), -0.5, 0.5), {})),
    ("clamp", "min_positional", lambda: ((r(3, 4), -0.5), {})),
    ("clamp", "min_only", lambda: ((r(3, 4),), {"min": -0.5})),
    ("clamp", "max_only", lambda: ((r(3, 4),), {"max": 0.3})),
    (
        "clamp",
        "tensor_bounds",
        lambda: ((r(3, 4),), {"min": -0.5 * pos(4), "max": 0.5 * pos(3, 1)}),
    ),
    ("clamp", "tensor_min", lambda: ((r(3, 4), 0.3 * r(3, 4)), {})),
    # selection
    ("where", "tensors", lambda: ((mask(3, 4), r(3, 4), r(4)), {})),
    ("where", "scalar_other", lambda: ((mask(3, 4), r(3, 4), 0.0), {})),
    ("where", "scalar_input", lambda: ((mask(4), 1.5, r(3, 4)), {})),
    ("tensor_where", "tensors", lambda: ((r(3, 4), mask(3, 4), r(3, 4)), {})),
    ("tensor_where", "scalar_other", lambda: ((r(3, 4), mask(4), 0.0), {})),
    ("maximum", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("maximum", "ties", lambda: (_ties(), {})),
    ("minimum", "broadcast", lambda: ((r(3, 1), r(4)), {})),
    ("minimum", "ties", lambda: (_ties(), {})),
    ("masked_fill", "scalar", lambda: ((r(3, 4), mask(3, 4), 0.5), {})),
    ("masked_fill", "tensor_value", lambda: ((r(3, 4), mask(4), r()), {})),
    ("masked_fill", "mask_broadcasts_x", lambda: ((r(4), mask(3, 4), 0.5), {})),
    # reductions
    ("sum_", "all", lambda: ((r(2, 3, 4),), {})),
    ("sum_", "all_keepdim", lambda: ((r(2, 3, 4),), {"dim": None, "keepdim": True})),
    ("sum_", "dim1", lambda: ((r(2, 3, 4), 1), {})),
    ("sum_", "neg_keepdim", lambda: ((r(2, 3, 4), -1, True), {})),
    ("sum_", "neg", lambda: ((r(2, 3, 4), -2), {})),
    ("sum_", "neg_tuple", lambda: ((r(2, 3, 4), (-1, 0)), {})),
    ("sum_", "tuple", lambda: ((r(2, 3, 4),), {"dim": (0, 2)})),
    (
        "sum_",
        "list_keepdim",
        lambda: ((r(2, 3, 4),), {"dim": [0, -1], "keepdim": True}),
    ),
    ("sum_", "empty_tuple", lambda: ((r(2, 3),), {"dim": ()})),
    ("sum_", "zero_dim", lambda: ((r(),), {})),
    ("mean", "all", lambda: ((r(2, 3, 4),), {})),
    ("mean", "all_keepdim", lambda: ((r(2, 3, 4),), {"dim": None, "keepdim": True})),
    ("mean", "dim1", lambda: ((r(2, 3, 4), 1), {})),
    ("mean", "neg_keepdim", lambda: ((r(2, 3, 4), -1, True), {})),
    ("mean", "neg", lambda: ((r(2, 3, 4), -1), {})),
    ("mean", "tuple", lambda: ((r(2, 3, 4),), {"dim": (0, 2)})),
    (
        "mean",
        "tuple_keepdim",
        lambda: ((r(2, 3, 4),), {"dim": (1, -1), "keepdim": True}),
    ),
    ("var", "all", lambda: ((r(2, 3, 4),), {})),
    ("var", "all_keepdim", lambda: ((r(2, 3, 4),), {"keepdim": True})),
    ("var", "dim1", lambda: ((r(2, 3, 4), 1), {})),
    ("var", "tuple_keepdim", lambda: ((r(2, 3, 4),), {"dim": (0, 2), "keepdim": True})),
    ("var", "biased", lambda: ((r(3, 5),), {"dim": -1, "correction": 0})),
    ("var", "correction2", lambda: ((r(3, 5),), {"dim": (0, 1), "correction": 2})),
    ("amax", "all", lambda: ((r(2, 3, 4),), {})),
    ("amax", "dim1", lambda: ((r(2, 3, 4), 1), {})),
    ("amax", "neg_tuple", lambda: ((r(2, 3, 4), (-1, -3)), {})),
    ("amax", "tuple_keepdim", lambda: ((r(2, 3, 4), (0, 2), True), {})),
    ("amax", "neg_keepdim", lambda: ((r(2, 3, 4),), {"dim": -1, "keepdim": True})),
    (
        "amax",
        "ties",
        lambda: (
            (torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], dtype=F64),),
            {"dim": 1},
        ),
    ),
    (
        "amax",
        "ties_all",
        lambda: ((torch.tensor([[1.0, 3.0, 3.0], [3.0, 2.0, 0.0]], dtype=F64),), {}),
    ),
    ("softmax", "last", lambda: ((r(2, 3, 4), -1), {})),
    ("softmax", "dim0", lambda: ((r(2, 3, 4),), {"dim": 0})),
    ("log_softmax", "last", lambda: ((r(2, 3, 4), -1), {})),
    ("log_softmax", "dim1", lambda: ((r(2, 3, 4),), {"dim": 1})),
    # shape and layout
    ("transpose", "outer", lambda: ((r(2, 3, 4), 0, 2), {})),
    ("transpose", "negative", lambda: ((r(2, 3, 4), -1, 1), {})),
    ("t", "2d", lambda: ((r(3, 4),), {})),
    ("t", "1d", lambda: ((r(3),), {})),
    ("permute", "tuple", lambda: ((r(2, 3, 4), (2, 0, 1)), {})),
    ("permute", "nested_negative", lambda: ((r(2, 3, 4), ((1, -1, 0),)), {})),
    ("reshape", "tuple", lambda: ((r(2, 3, 4), (6, 4)), {})),
    ("reshape", "flat", lambda: ((r(2, 3, 4), (-1,)), {})),
    ("reshape", "nested", lambda: ((r(2, 3, 4), ((4, -1),)), {})),
    ("view", "tuple", lambda: ((r(2, 3, 4), (4, 6)), {})),
    ("view", "nested", lambda: ((r(2, 3, 4), ((24,),)), {})),
    ("view", "dtype", lambda: ((r(2, 3, 4), (F64,)), {})),
    ("flatten", "default", lambda: ((r(2, 3, 4),), {})),
    ("flatten", "start1", lambda: ((r(2, 3, 4), 1), {})),
    ("flatten", "kw", lambda: ((r(2, 3, 4),), {"start_dim": 0, "end_dim": 1})),
    ("unsqueeze", "front", lambda: ((r(3, 4), 0), {})),
    ("unsqueeze", "back", lambda: ((r(3, 4), -1), {})),
    ("squeeze", "all", lambda: ((r(2, 1, 3, 1),), {})),
    ("squeeze", "dim", lambda: ((r(2, 1, 3, 1), 1), {})),
    ("squeeze", "dims", lambda: ((r(2, 1, 3, 1), (1, 3)), {})),
    ("expand", "tuple", lambda: ((r(3, 1), (2, 3, 4)), {})),
    ("expand", "nested_minus_one", lambda: ((r(3, 1), ((2, -1, 4),)), {})),
    ("expand_as", "broadcast", lambda: ((r(3, 1), r(2, 3, 4)), {})),
    ("broadcast_to", "broadcast", lambda: ((r(3, 1), (2, 3, 4)), {})),
    ("sum_to_size", "tuple", lambda: ((r(2, 3, 4), (3, 1)), {})),
    ("sum_to_size", "nested", lambda: ((r(2, 3, 4), ((1, 4),)), {})),
    ("tril", "square", lambda: ((r(4, 4),), {})),
    ("tril", "diagonal", lambda: ((r(2, 3, 5), 1), {})),
    ("triu", "square", lambda: ((r(4, 4),), {})),
    ("triu", "diagonal", lambda: ((r(2, 4, 3),), {"diagonal": -1})),
    # joining, splitting, indexing
    ("cat", "dim0", lambda: (([r(2, 3), r(4, 3)],), {})),
    ("cat", "dim1", lambda: (([r(2, 3), r(2, 1)], 1), {})),
    (
        "cat",
        "neg_three",
        lambda: (((r(2, 1, 3), r(2, 1, 2), r(2, 1, 1)),), {"dim": -1}),
    ),
    ("stack", "dim0", lambda: (([r(2, 3), r(2, 3), r(2, 3)],), {})),
    ("stack", "dim1", lambda: (([r(2, 3), r(2, 3)], 1), {})),
    ("stack", "neg", lambda: (((r(2, 3), r(2, 3)),), {"dim": -1})),
    ("split", "size", lambda: ((r(5, 3), 2), {})),
    ("split", "sections", lambda: ((r(3, 6), [1, 2, 3]), {"dim": 1})),
    ("unbind", "dim0", lambda: ((r(3, 4),), {})),
    ("unbind", "dim1", lambda: ((r(3, 4), 1), {})),
    ("index_select", "dim0_repeat", lambda: ((r(4, 3), 0, idx(0, 2, 2, 1)), {})),
    ("index_select", "dim1", lambda: ((r(4, 3), -1, idx(2, 0)), {})),
    ("index_add", "repeat", lambda: ((r(5, 3), 0, idx(0, 2, 2), r(3, 3)), {})),
    ("index_add", "alpha", lambda: ((r(3, 5), 1, idx(4, 0), r(3, 2)), {"alpha": 2.0})),
    ("gather", "dim1", lambda: ((r(3, 4), 1, idx([0, 3], [1, 1], [2, 0])), {})),
    ("gather", "dim0", lambda: ((r(3, 4), 0, idx([0, 2, 2, 1])), {})),
    (
        "scatter_add",
        "dim1",
        lambda: ((r(3, 4), 1, idx([0, 3], [1, 1], [2, 0]), r(3, 2)), {}),
    ),
    ("narrow", "dim1", lambda: ((r(4, 5), 1, 1, 3), {})),
    ("narrow", "negative", lambda: ((r(4, 5), -2, -3, 2), {})),
    ("narrow", "negative_to_end", lambda: ((r(4, 5), -2, -2, 2), {})),
    ("slice_scatter", "step", lambda: ((r(4, 6), r(4, 2), 1, 1, 5, 2), {})),
    ("slice_scatter", "dim0", lambda: ((r(4, 3), r(2, 3)), {"start": 1, "end": 3})),
    ("getitem", "int_slice", lambda: ((r(3, 4, 5), (0, slice(1, 3))), {})),
    (
        "getitem",
        "ellipsis_none_step",
        lambda: ((r(3, 4, 5), (Ellipsis, None, slice(None, None, 2))), {}),
    ),
    ("getitem", "int", lambda: ((r(3, 4, 5), 1), {})),
    ("getitem", "all_ints", lambda: ((r(3, 4), (2, 1)), {})),
    (
        "getitem",
        "slice_ellipsis_int",
        lambda: ((r(3, 4, 5), (slice(1, None), Ellipsis, 2)), {}),
    ),
    ("getitem", "index_tensor", lambda: ((r(3, 4), idx(0, 2, 0)), {})),
    ("getitem", "mixed_tensor", lambda: ((r(3, 4), (slice(None), idx(1, 1, 3))), {})),
    ("getitem", "bool_mask", lambda: ((r(3, 4), mask(3, 4)), {})),
    # conversions and copies
    ("to", "dtype", lambda: ((r(3, 4), (torch.float32,)), {})),
    ("to", "same_dtype", lambda: ((r(3, 4), (F64,)), {})),
    ("to", "device_dtype", lambda: ((r(3, 4), ("cpu", torch.float32)), {})),
    ("to", "like_tensor", lambda: ((r(3, 4), (r(2).float(),)), {"copy": True})),
    ("to", "integer_dtype", lambda: ((r(3, 4) * 3, (torch.int64,)), {})),
    ("to", "bool_dtype", lambda: ((r(3, 4), (torch.bool,)), {})),
    ("type_as", "down", lambda: ((r(3, 4), r(2).float()), {})),
    ("type_as", "up", lambda: ((r(3, 4).float(), r(2)), {})),
    ("type_as", "integer_dtype", lambda: ((r(3, 4) * 3, idx(1, 2)), {})),
    ("contiguous", "2d", lambda: ((r(3, 4),), {})),
    ("clone", "2d", lambda: ((r(3, 4),), {})),
    ("detach", "2d", lambda: ((r(3, 4),), {})),
    ("zeros_like", "2d", lambda: ((r(3, 4),), {})),
    ("ones_like", "2d", lambda: ((r(3, 4),), {})),
    # comparisons and boolean logic
    ("eq", "ties", lambda: (_ties(), {})),
    ("ne", "ties", lambda: (_ties(), {})),
    ("lt", "scalar", lambda: ((r(3, 4), 0.0), {})),
    ("le", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("gt", "scalar", lambda: ((r(3, 4), 0.2), {})),
    ("ge", "ties", lambda: (_ties(), {})),
    ("and_", "bool", lambda: ((mask(3, 4), mask(4)), {})),
    ("or_", "bool", lambda: ((mask(3, 4), mask(3, 4)), {})),
    ("xor", "bool", lambda: ((mask(3, 4), mask(3, 4)), {})),
    ("invert", "bool", lambda: ((mask(3, 4),), {})),
]

RULE_FUNCS = {f.__name__: f for f in set(RULES.values())}


def _params(rule):
    return list(inspect.signature(rule).parameters)


def _is_grad_tensor(v):
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _grad_leaves(v):
    """The float tensors that v (a parameter value) contributes as differentiable leaves."""
    if _is_grad_tensor(v):
        return [v]
    if isinstance(v, (list, tuple)) and v and all(_is_grad_tensor(e) for e in v):
        return list(v)
    return []


def _prepare(rule_name, factory, seed):
    """Rule, args, kwargs (float tensors are fresh leaves requiring grad) and bound parameter values."""
    rule = RULE_FUNCS[rule_name]
    torch.manual_seed(seed)
    args, kwargs = factory()

    def leaf(v):
        if _is_grad_tensor(v):
            return v.clone().requires_grad_()
        if isinstance(v, (list, tuple)) and v and all(_is_grad_tensor(e) for e in v):
            return type(v)(e.clone().requires_grad_() for e in v)
        return v

    args = [leaf(a) for a in args]
    kwargs = {k: leaf(v) for k, v in kwargs.items()}
    bound = inspect.signature(rule).bind(*args, **kwargs)
    bound.apply_defaults()
    return rule, args, kwargs, bound.arguments


def _as_seq(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _make_grads(out, requires_grad=False):
    """Random output gradients shaped like out (a sequence for sequence outputs)."""
    grads = []
    for o in _as_seq(out):
        g = torch.randn(o.shape, dtype=o.dtype if o.is_floating_point() else F64)
        grads.append(g.requires_grad_() if requires_grad else g)
    return grads if isinstance(out, (tuple, list)) else grads[0]


def _reference(out, grad, wrt, create_graph=False):
    """torch.autograd gradients of out (with output gradients grad) w.r.t. wrt, zeros where unused."""
    pairs = [
        (o, g)
        for o, g in zip(_as_seq(out), _as_seq(grad), strict=True)
        if o.requires_grad
    ]
    if not pairs:
        return [torch.zeros_like(w) for w in wrt]
    return list(
        torch.autograd.grad(
            [o for o, _ in pairs],
            wrt,
            [g for _, g in pairs],
            retain_graph=True,
            create_graph=create_graph,
            allow_unused=True,
            materialize_grads=True,
        )
    )


def _close(a, b, what):
    assert isinstance(
        a, torch.Tensor
    ), f"{what}: got {type(a).__name__}, expected a tensor"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.device == b.device, f"{what}: device {a.device} != {b.device}"
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------
# Rule sources: format, per-entry extraction (as the generator does it).
# --------------------------------------------------------------------------


@functools.cache
def _rule_ast(name):
    tree = ast.parse(textwrap.dedent(inspect.getsource(RULE_FUNCS[name])))
    (fn,) = tree.body
    return fn


def _split_rule(fn):
    body = fn.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body


def _return_entries(name):
    fn = _rule_ast(name)
    backward = _split_rule(fn)[1]
    value = backward.body[-1].value
    return value.elts if len(fn.args.args) > 1 else [value]


def _none_params(name):
    """Parameters whose backward entry is the literal None."""
    return {
        p
        for p, e in zip(_params(RULE_FUNCS[name]), _return_entries(name), strict=True)
        if isinstance(e, ast.Constant) and e.value is None
    }


def _loaded_names(node):
    return {
        n.id
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }


def _prune(stmts, needed):
    """Dead-code elimination over simple assignments and if/else: keep what `needed` depends on."""
    kept = []
    for stmt in reversed(stmts):
        if isinstance(stmt, ast.Assign):
            targets = {
                n.id
                for t in stmt.targets
                for n in ast.walk(t)
                if isinstance(n, ast.Name)
            }
            if targets & needed:
                kept.append(stmt)
                needed = (needed - targets) | _loaded_names(stmt.value)
        elif isinstance(stmt, ast.If):
            body, need_body = _prune(stmt.body, set(needed))
            orelse, need_else = _prune(stmt.orelse, set(needed))
            if body or orelse:
                stmt = copy.copy(stmt)
                stmt.body = body or [ast.Pass()]
                stmt.orelse = orelse
                kept.append(stmt)
                needed = need_body | need_else | _loaded_names(stmt.test)
        else:
            kept.append(stmt)
            needed = needed | _loaded_names(stmt)
    return kept[::-1], needed


def _compile_rule(fn):
    """Exec a rule's AST where only torch, math and builtins are visible (no module helpers)."""
    module = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(module)
    namespace = {"torch": torch, "math": math, **RUNTIME_HELPERS}
    exec(compile(module, f"<rule {fn.name}>", "exec"), namespace)
    return namespace[fn.name]


@functools.cache
def _full_rule(name):
    return _compile_rule(copy.deepcopy(_rule_ast(name)))


@functools.cache
def _entry_rule(name, i):
    """The rule with its backward cut down to entry i and the locals that entry needs."""
    fn = copy.deepcopy(_rule_ast(name))
    backward = _split_rule(fn)[1]
    entries = (
        backward.body[-1].value.elts
        if len(fn.args.args) > 1
        else [backward.body[-1].value]
    )
    entry = entries[i]
    body, _ = _prune(backward.body[:-1], _loaded_names(entry))
    backward.body = body + [ast.Return(value=entry)]
    fn.name = f"{name}__entry{i}"
    return _compile_rule(fn)


_BINOPS = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "truediv",
    ast.Pow: "pow",
    ast.MatMult: "matmul",
    ast.BitAnd: "and_",
    ast.BitOr: "or_",
    ast.BitXor: "xor",
}
_INT_BINOPS = {ast.Mod, ast.FloorDiv}  # only ever applied to Python ints (dims, sizes)
_CMPOPS = {
    ast.Eq: "eq",
    ast.NotEq: "ne",
    ast.Lt: "lt",
    ast.LtE: "le",
    ast.Gt: "gt",
    ast.GtE: "ge",
}
_FACTORIES = {"torch.arange", "torch.zeros", "torch.ones", "torch.full", "torch.empty"}
#: Metadata of a tensor, and a dtype's own kind (`out.dtype.is_floating_point`).
_METADATA_ATTRS = {"shape", "ndim", "dtype", "device", "is_floating_point", "is_complex"}
_NON_DIFF_METHODS = {"dim", "size", "numel", "index"}  # metadata, list.index
_FORBIDDEN = {"detach", "data", "item", "no_grad", "requires_grad_", "tolist", "numpy"}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _closure_problems(backward):
    """Operations in backward that have no rule (so could not be differentiated again)."""
    problems = []
    called = {id(n.func) for n in ast.walk(backward) if isinstance(n, ast.Call)}
    for node in ast.walk(backward):
        if isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN:
            problems.append(f"forbidden .{node.attr}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr.endswith("_")
            and not node.attr.startswith("_")
        ):
            problems.append(f"in-place .{node.attr}")
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if dotted and dotted.split(".")[0] in ("torch", "math"):
                if (
                    dotted.startswith("torch.")
                    and dotted not in RULES
                    and dotted not in _FACTORIES
                    and not opfacts.no_gradient(dotted)
                ):
                    problems.append(f"no rule for {dotted}")
            elif isinstance(node.func, ast.Name):
                if not hasattr(builtins, node.func.id) and node.func.id not in RUNTIME_HELPERS:
                    problems.append(f"call of non-builtin {node.func.id}")
            elif isinstance(node.func, ast.Attribute):
                if (
                    f"torch.Tensor.{node.func.attr}" not in RULES
                    and node.func.attr not in _NON_DIFF_METHODS
                ):
                    problems.append(f"no rule for method .{node.func.attr}")
        elif isinstance(node, ast.Attribute) and id(node) not in called:
            dotted = _dotted(node)
            if (
                not (dotted and dotted.split(".")[0] in ("torch", "math"))
                and node.attr not in _METADATA_ATTRS
            ):
                problems.append(f"attribute .{node.attr}")
        elif isinstance(node, ast.BinOp):
            if (
                type(node.op) not in _INT_BINOPS
                and f"operator.{_BINOPS.get(type(node.op))}" not in RULES
            ):
                problems.append(f"no rule for {type(node.op).__name__}")
        elif isinstance(node, ast.UnaryOp) and isinstance(
            node.op, (ast.USub, ast.Invert)
        ):
            if (
                f"operator.{'neg' if isinstance(node.op, ast.USub) else 'invert'}"
                not in RULES
            ):
                problems.append("no rule for unary op")
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) in _CMPOPS and f"operator.{_CMPOPS[type(op)]}" not in RULES:
                    problems.append(f"no rule for {type(op).__name__}")
        elif isinstance(node, ast.Subscript) and "operator.getitem" not in RULES:
            problems.append("no rule for getitem")
    return problems


@pytest.mark.parametrize("name", sorted(RULE_FUNCS))
def test_rule_format(name):
    fn = _rule_ast(name)
    params = _params(RULE_FUNCS[name])
    assert (
        not fn.args.vararg and not fn.args.kwarg and not fn.args.kwonlyargs
    ), "plain parameters only"
    body = _split_rule(fn)
    assert (
        len(body) == 3
    ), "body must be: out = ..., def backward(grad), return out, backward"
    assign, backward, ret = body
    assert isinstance(assign, ast.Assign) and len(assign.targets) == 1
    assert isinstance(assign.targets[0], ast.Name) and assign.targets[0].id == "out"
    assert isinstance(backward, ast.FunctionDef) and backward.name == "backward"
    a = backward.args
    assert [p.arg for p in a.args] == ["grad"] and not (
        a.vararg or a.kwarg or a.kwonlyargs or a.defaults
    )
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple)
    assert [getattr(e, "id", None) for e in ret.value.elts] == ["out", "backward"]

    # One return, last; one entry per parameter.
    returns = [n for n in ast.walk(backward) if isinstance(n, ast.Return)]
    assert (
        len(returns) == 1 and backward.body[-1] is returns[0]
    ), "backward needs exactly one, final return"
    value = returns[0].value
    if len(params) == 1:
        assert not isinstance(
            value, ast.Tuple
        ), "one-parameter rules return a bare entry"
    else:
        assert isinstance(value, ast.Tuple) and len(value.elts) == len(
            params
        ), f"backward must return {len(params)} entries"

    # Statements: assignments to local names and if/else only.
    for stmt in ast.walk(backward):
        if isinstance(stmt, ast.stmt) and stmt is not backward:
            assert isinstance(
                stmt, (ast.Assign, ast.If, ast.Return, ast.Pass)
            ), f"statement {type(stmt).__name__} not allowed in backward"
        if isinstance(stmt, ast.Assign):
            assert all(
                isinstance(t, ast.Name) for t in stmt.targets
            ), "assign to local names only"
        if isinstance(stmt, (ast.Lambda, ast.FunctionDef)) and stmt is not backward:
            raise AssertionError("no nested functions in backward")

    # Names read: grad, parameters, out, locals, comprehension variables, torch, math, builtins.
    local = {
        n.id
        for n in ast.walk(backward)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    allowed = {"grad", "out", "torch", "math"} | set(params) | local | set(RUNTIME_HELPERS)
    for used in _loaded_names(backward):
        assert used in allowed or (
            hasattr(builtins, used) and used not in vars(rules)
        ), f"backward reads {used!r}"
    for used in _loaded_names(assign.value):
        assert used in set(params) | {"torch", "math"} or hasattr(
            builtins, used
        ), f"out reads {used!r}"

    problems = _closure_problems(backward)
    assert not problems, problems

    # The inliner lifts each entry out of the return tuple and folds `if`s on constants:
    # an entry must parse on its own (no line breaks that rely on the tuple's brackets),
    # and branches are plain if/else (a folded `elif` cannot replace an else branch).
    source = textwrap.dedent(inspect.getsource(RULE_FUNCS[name]))
    for entry in _return_entries(name):
        segment = ast.get_source_segment(source, entry)
        try:
            ast.parse(segment, mode="eval")
        except SyntaxError as error:
            raise AssertionError(
                f"entry does not parse on its own: {segment!r}"
            ) from error
    assert not re.search(r"^\s*elif\b", source, re.MULTILINE), "use if/else, not elif"


def test_every_rule_has_an_example():
    covered = {n for n, _, _ in EXAMPLES}
    assert covered <= set(
        RULE_FUNCS
    ), f"examples for unknown rules: {covered - set(RULE_FUNCS)}"
    assert covered == set(
        RULE_FUNCS
    ), f"rules without examples: {sorted(set(RULE_FUNCS) - covered)}"


@pytest.mark.parametrize("name", sorted(RULE_FUNCS))
def test_non_differentiable_parameters_get_literal_none(name):
    """A parameter never given a float tensor in any example (dims, flags, ...) must get a literal None."""
    params = _params(RULE_FUNCS[name])
    ever_tensor = set()
    for n, _, factory in EXAMPLES:
        if n == name:
            _, _, _, bound = _prepare(n, factory, seed=0)
            ever_tensor |= {p for p in params if _grad_leaves(bound[p])}
    missing = set(params) - ever_tensor - _none_params(name)
    assert not missing, f"entries for {sorted(missing)} should be the literal None"


# --------------------------------------------------------------------------
# Numerical checks against torch.autograd.
# --------------------------------------------------------------------------

CASES = [pytest.param(n, f, id=f"{n}[{i}]") for n, i, f in EXAMPLES]


def _entry_value(entry_rule, args, kwargs, grad):
    out, backward = entry_rule(*args, **kwargs)
    return out, backward(grad)


@pytest.mark.parametrize("name,factory", CASES)
def test_first_order(name, factory):
    rule, args, kwargs, bound = _prepare(name, factory, seed=0)
    params = _params(rule)
    none_params = _none_params(name)
    out, _ = rule(*args, **kwargs)
    grad = _make_grads(out)

    # The whole backward, compiled without access to this module, when every entry it computes applies.
    if all(p in none_params or _grad_leaves(bound[p]) for p in params):
        full_out, backward = _full_rule(name)(*args, **kwargs)
        got = backward(grad)
        got = got if len(params) > 1 else (got,)
        assert len(got) == len(params)
        for p, g in zip(params, got, strict=True):
            if p in none_params:
                assert g is None

    for i, p in enumerate(params):
        leaves = _grad_leaves(bound[p])
        if not leaves:
            continue
        expected = _reference(out, grad, leaves)
        if p in none_params:
            for e in expected:
                assert (
                    not e.any()
                ), f"{p}: literal None entry but torch gives a nonzero gradient"
            continue
        entry_out, got = _entry_value(_entry_rule(name, i), args, kwargs, grad)
        for o, eo in zip(_as_seq(out), _as_seq(entry_out), strict=True):
            _close(eo.detach(), o.detach(), "out of the cut-down rule")
        if _is_grad_tensor(bound[p]):
            _close(got.detach(), expected[0], p)
        else:
            assert isinstance(got, (tuple, list)) and len(got) == len(
                leaves
            ), f"{p}: one gradient per tensor"
            for j, (g, e) in enumerate(zip(got, expected, strict=True)):
                _close(g.detach(), e, f"{p}[{j}]")


@pytest.mark.parametrize("name,factory", CASES)
def test_second_order(name, factory):
    rule, args, kwargs, bound = _prepare(name, factory, seed=1)
    params = _params(rule)
    all_leaves = [t for p in params for t in _grad_leaves(bound[p])]
    none_params = _none_params(name)
    for i, p in enumerate(params):
        leaves = _grad_leaves(bound[p])
        if not leaves or p in none_params:
            continue
        torch.manual_seed(100 + i)
        out, backward = _entry_rule(name, i)(*args, **kwargs)
        grad = _make_grads(out, requires_grad=True)
        got = (
            _as_seq(backward(grad))
            if not _is_grad_tensor(bound[p])
            else [backward(grad)]
        )
        weights = [torch.randn(g.shape, dtype=g.dtype) for g in got]
        ref = _reference(out, grad, leaves, create_graph=True)

        def weighted(gs, weights=weights):
            return sum((w * g).sum() for w, g in zip(weights, gs, strict=True))

        wrt = all_leaves + _as_seq(grad)
        names = [f"leaf{k}" for k in range(len(all_leaves))] + [
            f"grad{k}" for k in range(len(_as_seq(grad)))
        ]
        d_got = _derivatives(weighted(got), wrt)
        d_ref = _derivatives(weighted(ref), wrt)
        for n, a, b in zip(names, d_got, d_ref, strict=True):
            _close(a, b, f"d/d{n} of entry {p}")
        single = _is_grad_tensor(bound[p])
        _check_pure_and_mixed(name, i, args, kwargs, all_leaves, leaves, single)


def _swapped(value, replace):
    """`value` (an argument) with the tensors `replace` maps (by id) replaced."""
    if isinstance(value, torch.Tensor):
        return replace.get(id(value), value)
    if isinstance(value, (list, tuple)):
        return type(value)(_swapped(v, replace) for v in value)
    if isinstance(value, dict):
        return {k: _swapped(v, replace) for k, v in value.items()}
    return value


def _check_pure_and_mixed(name, i, args, kwargs, all_leaves, entry_leaves, single):
    """Entry `i` of rule `name` as the gradient of an op (its backward the op's, autograd
    through that backward at order 2) equals autograd through the rule's forward at
    orders 1 and 2 with respect to the entry's tensors (`single`: one tensor, else a
    list of them), in the pure shape and the mixed one (the output and its gradient in
    one loss), as tests/oracle.py takes them."""
    positions = [
        next(k for k, t in enumerate(all_leaves) if t is leaf) for leaf in entry_leaves
    ]

    def call(fn, tensors):
        replace = {id(t): new for t, new in zip(all_leaves, tensors, strict=True)}
        return fn(*_swapped(args, replace), **_swapped(kwargs, replace))

    def run(*tensors):
        out, backward = call(_entry_rule(name, i), tensors)

        def vjp(grads):
            entry = backward(grads if isinstance(out, (tuple, list)) else grads[0])
            found = [None] * len(tensors)
            entries = [entry] if single else entry
            for k, g in zip(positions, entries, strict=True):
                found[k] = g
            return found

        return out, vjp

    got = derivatives(
        closure_op(run), fresh_leaves(all_leaves), orders=2, wrt=positions
    )
    expected = derivatives(
        lambda *ts: call(RULE_FUNCS[name], ts)[0],
        fresh_leaves(all_leaves),
        orders=2,
        wrt=positions,
    )
    assert_same(got, expected, rtol=RTOL, atol=ATOL, what=f"entry {i}: ")


def _derivatives(scalar, wrt):
    if not scalar.requires_grad:
        return [torch.zeros_like(w) for w in wrt]
    return torch.autograd.grad(
        scalar, wrt, retain_graph=True, allow_unused=True, materialize_grads=True
    )


def test_sequence_output_rules_accept_missing_gradients():
    x = r(5, 3).requires_grad_()
    out, backward = rules.split(x, 2)
    g = r(2, 3)
    got = backward([None, g, None])[0]
    _close(
        got,
        torch.cat([torch.zeros(2, 3, dtype=F64), g, torch.zeros(1, 3, dtype=F64)]),
        "split",
    )
    out, backward = rules.unbind(x, 1)
    got = backward([None, r(5), None])[0]
    assert got.shape == x.shape and not got[:, 0].any() and not got[:, 2].any()


# --------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------


def _resolve(key):
    head, _, rest = key.partition(".")
    obj = importlib.import_module(head)
    for part in rest.split("."):
        obj = getattr(obj, part)
    return obj


def _same(a, b):
    a, b = _as_seq(a), _as_seq(b)
    return len(a) == len(b) and all(
        isinstance(y, torch.Tensor)
        and x.shape == y.shape
        and x.dtype == y.dtype
        and torch.equal(x.detach(), y.detach())
        for x, y in zip(a, b, strict=True)
    )


def test_registry_keys_name_real_ops():
    """Every qualified name resolves and agrees with its rule's forward on some example."""
    assert all(
        isinstance(k, str) and k.split(".")[0] in ("operator", "torch") for k in RULES
    )
    unmatched = []
    for key, rule in sorted(RULES.items()):
        target = _resolve(key)
        matched = False
        for name, _, factory in EXAMPLES:
            if name != rule.__name__:
                continue
            _, args, kwargs, _ = _prepare(name, factory, seed=0)
            expected, _ = rule(*args, **kwargs)
            call_args = list(args)
            if key in VARARGS:
                k = _params(rule).index(VARARGS[key])
                if k >= len(call_args):
                    continue
                call_args = call_args[:k] + list(call_args[k]) + call_args[k + 1 :]
            try:
                actual = target(*call_args, **kwargs)
            except (TypeError, RuntimeError, ValueError, IndexError):
                continue
            assert _same(actual, expected), f"{key} disagrees with rule {name}"
            matched = True
        if not matched:
            unmatched.append(key)
    assert not unmatched, f"no example exercises: {unmatched}"


def test_varargs_entries():
    for key, param in VARARGS.items():
        assert key in RULES, key
        assert key.startswith("torch.Tensor."), key
        params = _params(RULES[key])
        assert (
            param in params and params.index(param) == 1
        ), f"{key}: {param} must follow the receiver"
    # Both spellings the generator may pass: all positional args, or one tuple/list argument.
    x = r(2, 3, 4)
    for rule, flat in [
        (rules.reshape, (4, 6)),
        (rules.view, (6, 4)),
        (rules.permute, (2, 0, 1)),
        (rules.expand, (3, 2, 3, 4)),
        (rules.sum_to_size, (1, 4)),
    ]:
        a, _ = rule(x, flat)
        b, _ = rule(x, (list(flat),))
        assert torch.equal(a, b), rule.__name__


def test_registry_covers_the_required_spellings():
    required = [
        f"operator.{n}"
        for n in "add sub mul truediv neg pow matmul getitem eq ne lt le gt ge".split()
    ]
    required += [
        "torch.mm",
        "torch.bmm",
        "torch.Tensor.mm",
        "torch.Tensor.bmm",
        "torch.matmul",
        "torch.Tensor.matmul",
        "torch.nn.functional.relu",
        "torch.relu",
        "torch.Tensor.relu",
        "torch.nn.functional.gelu",
        "torch.nn.functional.softplus",
        "torch.where",
        "torch.cat",
        "torch.stack",
        "torch.Tensor.to",
        "torch.Tensor.view",
    ]
    missing = [k for k in required if k not in RULES]
    assert not missing, missing
