"""Closure-style rules as other people write them (issue 11), against torch.autograd.

Each case is a module-level differentiator of a kind that once converted and then
crashed or lost a gradient: lists of tensors in and out, values of other kinds returned
by torch calls (`int[]?`, `bool`), containers of temporaries filled in loops,
forward-side construction (in-place writes to fresh values), flat multi-output returns,
names Python mangles. For every case the generated op's outputs and its gradients of
orders 1, 2 and 3 (of weighted sums, some outputs left without gradient; each order
alone and with the output and the earlier gradients in one loss) equal torch.autograd
through the closure's own forward, in float64, and `gradcheck` and
`gradgradcheck` pass on the op. The source module is importable (the generated module
imports its helpers from it), as it is for users.
"""

from __future__ import annotations

import hashlib
import re
import sys
import textwrap
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from oracle import Derivatives, assert_same, derivatives, leaves

from s2sgrad import transform
from s2sgrad.diagnostics import TransformError

F64 = torch.float64
ROOT_BAD = Path(__file__).resolve().parent / "bad_inputs"


def r(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=F64, requires_grad=True)


@dataclass
class Case:
    name: str
    source: str
    function: str
    #: Returns (args, kwargs) with fresh tensors requiring grad.
    inputs: Callable[[], tuple[list[Any], dict[str, Any]]]
    #: Which outputs (flattened) the loss uses; None: all.
    used: Sequence[int] | None = None
    #: The op draws random numbers: reseed before each call.
    random: bool = False
    orders: Sequence[int] = (1, 2, 3)
    #: Finite differences apply (False where forward detaches a value on purpose).
    gradcheck: bool = True
    #: Substrings the generated module must contain.
    generated: Sequence[str] = field(default_factory=tuple)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in an argument or a result (lists and tuples flattened)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def load(case: Case) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(closure module, generated module, generated text)."""
    digest = hashlib.sha256(case.source.encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", case.name)
    name = f"wild_{stem}_{digest}"
    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    exec(compile(case.source, f"{name}.py", "exec"), module.__dict__)
    sys.modules[name] = module
    text = transform(case.source, f"{name}.py", name)
    generated: dict[str, Any] = {"__name__": f"{name}_grad"}
    exec(compile(text, f"{name}_grad.py", "exec"), generated)
    return module.__dict__, generated, text


def closure_forward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The closure's result, computed by torch (the flat form returns `*outs, bw`)."""

    def result(*args: Any, **kwargs: Any) -> Any:
        *outputs, _backward = fn(*args, **kwargs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    return result


def grads(fn: Callable[..., Any], case: Case, seed: int = 0) -> Derivatives:
    """Outputs and gradients of orders 1..max(case.orders) w.r.t. every input tensor,
    by torch.autograd, each order alone and with the output and the earlier gradients
    in one loss (tests/oracle.py); the loss reads the outputs `case.used` names."""
    torch.manual_seed(seed)
    args, kwargs = case.inputs()
    inputs = [t for t in tensors_of(args) + tensors_of(kwargs) if t.requires_grad]

    def call(*tensors: torch.Tensor) -> Any:
        replace = {id(t): new for t, new in zip(inputs, tensors, strict=True)}

        def swap(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return replace.get(id(value), value)
            if isinstance(value, (list, tuple)):
                return type(value)(swap(v) for v in value)
            if isinstance(value, dict):
                return {k: swap(v) for k, v in value.items()}
            return value

        if case.random:
            torch.manual_seed(1234)
        return fn(*swap(args), **swap(kwargs))

    return derivatives(call, leaves(inputs), orders=max(case.orders), used=case.used)


# Sources that two cases run with different kinds of argument.
_SCALED_SIN = """
        import torch

        def scaled_sin(x: torch.Tensor, s: torch.Tensor | float):
            y = x * s
            t = torch.sin(y)
            def backward(g):
                gy = g * torch.cos(y)
                return gy * s, (gy * x).sum() if isinstance(s, torch.Tensor) else None
            return t, backward
        """


_AFFINE = """
        import torch

        def affine(x, w, bias=None):
            y = x @ w
            if bias is not None:
                y = y + bias
            t = torch.tanh(y)
            def backward(g):
                gy = g * (1 - t * t)
                gb = gy.sum(0) if bias is not None else None
                return gy @ w.t(), x.t() @ gy, gb
            return t, backward
        """


_WITH_EXTRA = """
        import torch

        def _extra(x, flag):
            return x * 2 if flag else None

        def with_extra(x: torch.Tensor, flag: bool = True):
            y = torch.sin(x)
            e = _extra(x, flag)
            def backward(gy, ge):
                gx = gy * torch.cos(x)
                if ge is not None:
                    gx = gx + 2 * ge
                return gx, None
            return (y, e), backward
        """


#: A number parameter that backward returns a gradient for (given a tensor or a number).
SCALED_BY_A_FLOAT = """
import torch

def scaled(x: torch.Tensor, alpha: float, beta=2.0):
    y = x * alpha + beta
    def backward(g):
        return g * alpha, (g * x).sum(), g.sum()
    return y, backward
"""


CASES = [
    Case(
        "cat_scale",
        """
        from typing import List
        import torch

        def cat_scale(xs: List[torch.Tensor], scale: float):
            sizes = [x.shape[0] for x in xs]
            out = torch.cat(xs, 0) * scale
            def backward(g):
                return list((g * scale).split(sizes, 0)), None
            return out, backward
        """,
        "cat_scale",
        lambda: ([[r(2, 3), r(1, 3), r(3, 3)], 1.5], {}),
        generated=("def forward(scale: float, *xs: Tensor) -> Any:",),
    ),
    Case(
        "addcmul_sizes",
        """
        import torch

        def addcmul(self, t1, t2, *, value: float):
            result = torch.addcmul(self, t1, t2, value=value)
            t1_size = torch.ops.aten._size_if_not_equal(t1.size(), result.size())
            t2_size = torch.ops.aten._size_if_not_equal(t2.size(), result.size())
            def backward(g):
                return (
                    g,
                    torch.ops.aten._grad_sum_to_size(g * value * t2, t1_size),
                    torch.ops.aten._grad_sum_to_size(g * value * t1, t2_size),
                    None,
                )
            return result, backward
        """,
        "addcmul",
        lambda: ([r(2, 3), r(3), r(2, 1)], {"value": 0.5}),
    ),
    Case(
        "module_level_aliases_of_torch_namespaces",
        """
        import torch

        aten = torch.ops.aten

        def slice_rows(self, dim: int = 0, start: int = 0, end: int = 9, step: int = 1):
            result = aten.slice(self, dim, start, end, step)
            def backward(grad_output):
                grad_self = aten.slice_backward(
                    grad_output, self.size(), dim, start, end, step
                )
                return grad_self, None, None, None, None
            return result, backward
        """,
        "slice_rows",
        lambda: ([r(5, 3), 0, 1, 4, 2], {}),
        generated=("aten.slice(",),
    ),
    Case(
        "alias_whose_temporary_is_promoted",
        """
        import torch

        F = torch.nn.functional

        def softplus_scaled(x: torch.Tensor, beta: float):
            y = F.softplus(x * beta) / beta
            s = torch.sigmoid(x * beta)
            def backward(g):
                return g * s, None
            return y, backward
        """,
        "softplus_scaled",
        lambda: ([r(3, 4), 1.5], {}),
    ),
    Case(
        "calls_through_torch_C_namespaces",
        """
        from typing import List

        import torch

        def adaptive_avg_pool2d(self, output_size: List[int]):
            def backward(grad_output):
                grad_self = torch.ops.aten._adaptive_avg_pool2d_backward(grad_output, self)
                return grad_self, None
            return torch._C._nn.adaptive_avg_pool2d(self, output_size), backward
        """,
        "adaptive_avg_pool2d",
        lambda: ([r(1, 2, 4, 4), [2, 2]], {}),
    ),
    Case(
        "nonzero_as_tuple_captured_by_backward",
        """
        import torch

        def positive_part(x: torch.Tensor):
            nz = torch.nonzero(x > 0, as_tuple=True)
            y = x[nz]
            def backward(g):
                gx = torch.zeros_like(x)
                gx[nz] = g
                return gx
            return y, backward
        """,
        "positive_part",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "numpy_keyword_spellings",
        """
        import torch

        def centered(x: torch.Tensor):
            m = x.mean(axis=-1, keepdims=True)
            y = torch.sum((x - m) ** 2, axis=0)
            def backward(g):
                xc = x - m
                gc = 2 * g * xc
                return gc - gc.mean(axis=-1, keepdims=True)
            return y, backward
        """,
        "centered",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "keywords_of_functions_written_in_python",
        """
        import torch

        def contract(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor):
            y = torch.tensordot(a, b, dims=([1], [0]))
            uniq, inverse = labels.unique(return_inverse=True)
            pooled = torch.zeros(uniq.shape[0], y.shape[1], dtype=y.dtype)
            pooled = pooled.index_add(0, inverse, y)
            def backward(g):
                gy = g[inverse]
                return gy @ b.t(), a.t() @ gy, None
            return pooled, backward
        """,
        "contract",
        lambda: ([r(5, 2), r(2, 3), torch.tensor([2, 0, 2, 1, 0])], {}),
    ),
    Case(
        "function_defined_in_forward",
        """
        import torch

        def gated(x: torch.Tensor, w: torch.Tensor):
            def act(t):
                return t * torch.sigmoid(t * w)
            y = act(x)
            z = y * y
            def backward(g):
                s = torch.sigmoid(x * w)
                dy = s + x * w * s * (1 - s)
                gw = (2 * g * y * x * x * s * (1 - s)).sum_to_size(w.shape)
                return 2 * g * y * dy, gw
            return z, backward
        """,
        "gated",
        lambda: ([r(3, 4), r(4)], {}),
    ),
    Case(
        "lambda_defined_in_forward",
        """
        import torch

        def doubled_tanh(x: torch.Tensor):
            act = lambda t: torch.tanh(t) * 2.0
            y = act(x)
            def backward(g):
                return g * 2.0 * (1 - torch.tanh(x) ** 2)
            return y, backward
        """,
        "doubled_tanh",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "float_annotated_parameter_given_a_tensor",
        SCALED_BY_A_FLOAT,
        "scaled",
        lambda: ([r(3, 4), r(), r()], {}),
    ),
    Case(
        "float_annotated_parameter_given_a_number",
        SCALED_BY_A_FLOAT,
        "scaled",
        lambda: ([r(3, 4), 0.5], {"beta": 1.5}),
    ),
    Case(
        "backward_returns_tuple_arithmetic",
        """
        import torch

        def scaled(x: torch.Tensor, w: torch.Tensor, k: int, flag: bool, alpha: float):
            y = x * w * alpha
            def backward(g):
                if flag:
                    return (g * w * alpha,) + (g * x * alpha,) + (None,) * 3
                return (g * w * alpha, g * x * alpha) + 3 * (None,)
            return y, backward
        """,
        "scaled",
        lambda: ([r(3, 4), r(4), 2, True, 0.5], {}),
    ),
    Case(
        "item_store_before_a_helper_rebinds_the_name",
        """
        import torch

        def cube(v):
            return v * v * v

        def layer(inp: torch.Tensor):
            t1 = inp * 1.5
            t1[0:1] = torch.zeros(())
            t3 = inp - t1
            t1 = cube(t1)
            def backward(g1, g2):
                t1s = inp - t3
                m = torch.ones_like(inp)
                m[0:1] = 0
                return g2 + (g1 * 3 * t1s * t1s - g2) * 1.5 * m
            return (t1, t3), backward
        """,
        "layer",
        lambda: ([r(3, 2)], {}),
    ),
    Case(
        "unrolled_list_of_temporaries",
        """
        import torch

        def unrolled(x: torch.Tensor, w: torch.Tensor, steps: int = 3):
            hs = []
            h = x
            for _ in range(steps):
                h = torch.tanh(h @ w)
                hs.append(h)
            def backward(g):
                gx, gw = g, torch.zeros_like(w)
                for i in reversed(range(steps)):
                    prev = hs[i - 1] if i > 0 else x
                    ga = gx * (1 - hs[i] * hs[i])
                    gw = gw + prev.t() @ ga
                    gx = ga @ w.t()
                return gx, gw, None
            return h, backward
        """,
        "unrolled",
        lambda: ([r(2, 3), r(3, 3)], {}),
        generated=("hs.append(h)",),
    ),
    Case(
        "list_filled_by_index_and_insert",
        """
        import torch

        def ladder(x: torch.Tensor, n: int = 3):
            acts = [None] * n
            for i in range(n):
                acts[i] = torch.sin(x * (i + 1))
            firsts = []
            firsts.insert(0, acts[0])
            def backward(g):
                total = 0
                for i in range(n):
                    total = total + g * (i + 1) * torch.cos(x * (i + 1)) * acts[-1]
                    total = total + g * acts[i] * (n * torch.cos(x * n))
                return total + 0 * firsts[0], None
            return sum(a * acts[-1] for a in acts), backward
        """,
        "ladder",
        lambda: ([r(4)], {}),
    ),
    Case(
        "dict_filled_by_key",
        """
        import torch

        def two_powers(x: torch.Tensor):
            cache = {}
            cache["sq"] = x * x
            cache["cube"] = cache["sq"] * x
            def backward(g):
                return g * (2 * x + 3 * cache["sq"])
            return cache["sq"] + cache["cube"], backward
        """,
        "two_powers",
        lambda: ([r(3, 2)], {}),
    ),
    Case(
        "comprehension_over_list_param",
        """
        from typing import Sequence
        import torch

        def sum_of_squares(xs: Sequence[torch.Tensor]):
            squares = [x * x for x in xs]
            def backward(g):
                return [2 * g * sq / x for sq, x in zip(squares, xs)]
            return torch.stack(squares).sum(0), backward
        """,
        "sum_of_squares",
        lambda: ([[r(3), r(3)]], {}),
    ),
    Case(
        "stack_of_list_param",
        """
        from typing import List
        import torch

        def weighted_stack(xs: List[torch.Tensor], w: torch.Tensor):
            s = torch.stack(xs) * w
            def backward(g):
                return list((g * w).unbind(0)), (g * torch.stack(xs)).sum(0)
            return s, backward
        """,
        "weighted_stack",
        lambda: ([[r(3), r(3), r(3)], r(3)], {}),
    ),
    Case(
        "empty_list_param",
        """
        from typing import List
        import torch

        def biased_sum(xs: List[torch.Tensor], b: torch.Tensor):
            total = b * 1.0
            for x in xs:
                total = total + x.sum()
            def backward(g):
                return [g.sum() * torch.ones_like(x) for x in xs], g
            return total, backward
        """,
        "biased_sum",
        lambda: ([[], r(2)], {}),
    ),
    Case(
        "tuple_param_and_element_metadata",
        """
        import torch

        def lengths_weighted(parts: tuple[torch.Tensor, ...], w: torch.Tensor):
            n = [p.shape[0] for p in parts]
            out = torch.cat([p * w for p in parts])
            def backward(g):
                pieces = g.split(n)
                return (
                    tuple(q * w for q in pieces),
                    sum((q * p).sum(0) for q, p in zip(pieces, parts)),
                )
            return out, backward
        """,
        "lengths_weighted",
        lambda: ([(r(1, 2), r(2, 2)), r(2)], {}),
    ),
    Case(
        "split_output",
        """
        import torch

        def halves(x: torch.Tensor):
            pieces = torch.split(x * 3.0, 2)
            def backward(grads):
                return 3.0 * torch.cat(grads)
            return pieces, backward
        """,
        "halves",
        lambda: ([r(6, 2)], {}),
        used=(0, 2),
    ),
    Case(
        "unbind_and_tensor_outputs",
        """
        import torch

        def rows_and_total(x: torch.Tensor):
            rows = torch.exp(x).unbind(0)
            total = x.sum()
            def backward(grad_rows, grad_total):
                return torch.stack(grad_rows) * torch.exp(x) + grad_total
            return (rows, total), backward
        """,
        "rows_and_total",
        lambda: ([r(3, 2)], {}),
        used=(1, 3),
    ),
    Case(
        "chunk_list_output",
        """
        import torch

        def chunks(x: torch.Tensor):
            parts = list(torch.sin(x).chunk(3))
            def backward(grads):
                return torch.cat(grads) * torch.cos(x)
            return parts, backward
        """,
        "chunks",
        lambda: ([r(6)], {}),
        used=(1,),
    ),
    Case(
        "meshgrid_output",
        """
        import torch

        def grid(a: torch.Tensor, b: torch.Tensor):
            ga, gb = torch.meshgrid(a * 2.0, b, indexing="ij")
            def backward(grads):
                return grads[0].sum(1) * 2.0, grads[1].sum(0)
            return torch.meshgrid(a * 2.0, b, indexing="ij"), backward
        """,
        "grid",
        lambda: ([r(3), r(2)], {}),
    ),
    Case(
        "int_list_and_bool_from_torch_calls",
        """
        import torch

        def _use_batch_stats(training: bool, x):
            return training and x.dim() > 1

        def norm_like(x: torch.Tensor, training: bool = True):
            size = x.size()
            batch = _use_batch_stats(training or torch.is_nonzero(x.new_zeros(())), x)
            mean = x.mean(0, keepdim=True) if batch else x.mean()
            out = (x - mean).expand(2, *size)
            def backward(g):
                gs = g.sum(0)
                if batch:
                    return gs - gs.mean(0, keepdim=True), None
                return gs - gs.mean(), None
            return out, backward
        """,
        "norm_like",
        lambda: ([r(3, 2)], {}),
    ),
    Case(
        "bernoulli_mask_built_in_forward",
        """
        import torch

        def masked_square(x: torch.Tensor, p: float = 0.5):
            mask = torch.empty_like(x)
            mask.bernoulli_(1 - p)
            y = x * mask
            def backward(g):
                return 2 * g * y * mask, None
            return y * y, backward
        """,
        "masked_square",
        lambda: ([r(5)], {}),
        random=True,
    ),
    Case(
        "buffer_filled_with_index_put",
        """
        import torch

        def scatter_scale(x: torch.Tensor, w: torch.Tensor):
            buf = torch.zeros(4, dtype=x.dtype)
            buf.index_put_((torch.tensor([0, 2]),), torch.tensor([1.0, 3.0], dtype=x.dtype))
            gains = torch.zeros(4, dtype=x.dtype)
            gains.index_put_((torch.tensor([1, 3]),), w)
            y = x * buf + x * gains
            def backward(g):
                return g * (buf + gains), (g * x)[torch.tensor([1, 3])]
            return y * 1.0, backward
        """,
        "scatter_scale",
        lambda: ([r(4), r(2)], {}),
        generated=("gains = gains.index_put(",),
    ),
    Case(
        "item_store_on_a_differentiable_temporary",
        """
        import torch

        def pinned(x: torch.Tensor):
            t = x * 3
            t[0] = 1.0
            y = t * x
            def backward(g):
                gx = g * t + g * x * 3
                gx[0] = g[0] * t[0]
                return gx
            return y, backward
        """,
        "pinned",
        lambda: ([r(4)], {}),
        generated=("t = _setitem(t, 0, 1.0)", "an item store `t[...] = ...`"),
    ),
    Case(
        "masked_scores_stored_by_a_boolean_index",
        """
        import torch

        def masked_softmax(x: torch.Tensor, mask: torch.Tensor):
            scores = x * 2
            scores[mask] = float("-inf")
            p = torch.softmax(scores, -1)
            def backward(g):
                return 2 * p * (g - (g * p).sum(-1, keepdim=True)), None
            return p, backward
        """,
        "masked_softmax",
        lambda: ([r(3, 4), torch.tensor([[True, False, False, False]] * 3)], {}),
        generated=('scores = _setitem(scores, mask, float("-inf"))',),
    ),
    Case(
        "buffer_of_differentiable_rows_by_slices",
        """
        import torch

        def swap_and_stack(x: torch.Tensor, w: torch.Tensor):
            out = torch.empty(2, x.shape[0], x.shape[1], dtype=x.dtype)
            out[0, :, ::2] = x[:, 1::2] * w
            out[0, :, 1::2] = x[:, ::2]
            out[1] = x.sin()
            y = out.sum(0)
            def backward(g):
                gx = torch.empty_like(g)
                gx[:, 1::2] = g[:, ::2] * w
                gx[:, ::2] = g[:, 1::2]
                gw = (g[:, ::2] * x[:, 1::2]).sum()
                return gx + g * out[1].cos() * 0 + g * x.cos(), gw
            return y, backward
        """,
        "swap_and_stack",
        lambda: ([r(3, 4), r()], {}),
        generated=("out = _setitem(out, (0, slice(None), slice(None, None, 2)), ",),
    ),
    Case(
        "item_stores_with_every_index_form",
        """
        import torch

        def zeroed_square(x: torch.Tensor):
            t = x * 2
            t[..., 1:3] = 0
            t[0,] = 0.0
            t[::2, -1] = torch.zeros(())
            t[None, 1, :1] = 0
            t[-1:, 2:] = 0
            def backward(g):
                return 4 * g * t
            return t * t, backward
        """,
        "zeroed_square",
        lambda: ([r(4, 5)], {}),
        generated=(
            "t = _setitem(t, (..., slice(1, 3)), 0)",
            "t = _setitem(t, (0,), 0.0)",
            "t = _setitem(t, (slice(None, None, 2), -1), torch.zeros(()))",
            "t = _setitem(t, (None, 1, slice(None, 1)), 0)",
            "t = _setitem(t, (slice(-1, None), slice(2, None)), 0)",
        ),
    ),
    Case(
        "inplace_op_on_a_row_of_a_temporary",
        """
        import torch

        def double_first_row(x: torch.Tensor, k: int = 1):
            t = x * 1.0
            t[0].mul_(2.0)
            t[-k:, ::2].clamp_(min=0.0)
            def backward(g):
                m = torch.ones_like(g)
                m[0] = 2.0
                m[-k:, ::2] = m[-k:, ::2] * (t[-k:, ::2] > 0)
                return g * m, None
            return t, backward
        """,
        "double_first_row",
        lambda: ([r(3, 4)], {}),
        generated=(
            "t = _setitem(t, 0, t[0].mul(2.0))",
            "t = _setitem(t, (slice(-k, None), slice(None, None, 2)), t[-k:, ::2].clamp(min=0.0))",
        ),
    ),
    Case(
        "augmented_item_store_in_a_loop",
        """
        import torch

        def acc_rows(x: torch.Tensor, w: torch.Tensor):
            h = x * w
            for i in range(h.shape[0]):
                h[i] += w * i
            s = h.sin()
            def backward(g):
                c = g * h.cos()
                ar = torch.arange(x.shape[0], dtype=x.dtype).unsqueeze(1)
                return c * w, (c * x).sum(0) + (c * ar).sum(0)
            return s, backward
        """,
        "acc_rows",
        lambda: ([r(3, 2), r(2)], {}),
        generated=("h = _setitem(h, i, h[i] + (w * i))",),
    ),
    Case(
        "inplace_on_differentiable_temporary",
        """
        import torch
        import torch.nn.functional as F

        def clipped(x: torch.Tensor):
            t = x * 2
            t.clamp_(min=0)
            u = x * 3.0
            torch.relu_(u)
            v = F.relu(x - 0.5, inplace=True)
            def backward(grad):
                return grad * (2 * (t > 0) + 3 * (u > 0) + (v > 0))
            return t + u + v, backward
        """,
        "clipped",
        lambda: ([r(6)], {}),
        generated=("t = t.clamp(min=0)", "u = torch.relu(u)"),
    ),
    Case(
        "flat_multi_output_return",
        """
        import torch

        def sin_cos(x: torch.Tensor):
            s = torch.sin(x)
            c = torch.cos(x)
            def backward(grad_s, grad_c):
                return grad_s * c - grad_c * s
            return s, c, backward
        """,
        "sin_cos",
        lambda: ([r(4)], {}),
        used=(1,),
    ),
    Case(
        "mangled_names",
        """
        import torch

        def __gain(x):
            return torch.tanh(x) * 0.5 + 1.0

        def __interpolate(x: torch.Tensor, scale: float):
            g = __gain(x)
            y = x * g * scale
            def backward(grad):
                dg = 0.5 * (1 - torch.tanh(x) ** 2)
                return grad * scale * (g + x * dg), None
            return y, backward
        """,
        "__interpolate",
        lambda: ([r(3), 2.0], {}),
    ),
    Case(
        "tensor_or_number_parameter",
        """
        import torch

        def scaled(x: torch.Tensor, s: torch.Tensor | float):
            y = x * s
            def backward(g):
                return g * s, (g * x).sum() if isinstance(s, torch.Tensor) else None
            return y, backward
        """,
        "scaled",
        lambda: ([r(3), r()], {}),
    ),
    Case(
        "helper_of_unknown_kind_captured",
        """
        import torch

        def _maybe(x, flag):
            if flag:
                return x.detach() * 2
            return 2.0

        def scale_by(x: torch.Tensor, flag: bool = True):
            k = _maybe(x, flag)
            def backward(g):
                return g * k, None
            return x * k, backward
        """,
        "scale_by",
        lambda: ([r(3)], {}),
        gradcheck=False,
    ),
    Case(
        "gradients_in_a_list_display",
        """
        import torch

        def mul_listed(a: torch.Tensor, b: torch.Tensor):
            y = a * b
            def backward(g):
                return [g * b, g * a]
            return y, backward
        """,
        "mul_listed",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        "gradients_in_a_list_by_name",
        """
        import torch

        def sin_mul_listed(a: torch.Tensor, b: torch.Tensor):
            s = torch.sin(a)
            y = s * b
            def backward(g):
                grads = [g * b * torch.cos(a), g * s]
                return grads
            return y, backward
        """,
        "sin_mul_listed",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        "gradients_in_a_list_by_name_no_temporary",
        """
        import torch

        def mul_list_var(a: torch.Tensor, b: torch.Tensor, k: float = 2.0):
            y = a * b * k
            def backward(g):
                grads = [g * b * k, g * a * k, None]
                return grads
            return y, backward
        """,
        "mul_list_var",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        "named_tuple_field_as_output",
        """
        import torch

        def row_max(x: torch.Tensor):
            vals = x.max(dim=1).values
            idx = x.argmax(dim=1)
            def backward(g):
                return torch.zeros_like(x).scatter(1, idx.unsqueeze(1), g.unsqueeze(1))
            return vals, backward
        """,
        "row_max",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "named_tuple_fields_captured",
        """
        import torch

        def times_row_max(x: torch.Tensor):
            top = x.max(dim=1, keepdim=True)
            m = top.values
            y = x * m
            def backward(g):
                gm = (g * x).sum(1, keepdim=True)
                return g * m + torch.zeros_like(x).scatter(1, top.indices, gm)
            return y, backward
        """,
        "times_row_max",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "named_tuple_field_of_sort",
        """
        import torch

        def sorted_twice(x: torch.Tensor):
            s = torch.sort(x, dim=-1, descending=True)
            y = s.values * 2
            def backward(g):
                return torch.zeros_like(x).scatter(-1, s.indices, g * 2)
            return y, backward
        """,
        "sorted_twice",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "temporary_of_a_tensor_or_number_with_a_tensor",
        _SCALED_SIN,
        "scaled_sin",
        lambda: ([r(3), r()], {}),
    ),
    Case(
        "temporary_of_a_tensor_or_number_with_a_number",
        _SCALED_SIN,
        "scaled_sin",
        lambda: ([r(3), 2.5], {}),
    ),
    Case(
        "unannotated_none_default_given_a_tensor",
        _AFFINE,
        "affine",
        lambda: ([r(2, 3), r(3, 4), r(4)], {}),
    ),
    Case(
        "unannotated_none_default_left_none",
        _AFFINE,
        "affine",
        lambda: ([r(2, 3), r(3, 4)], {}),
    ),
    Case(
        "a_number_among_the_outputs",
        """
        import torch

        def tripled_and_rows(x: torch.Tensor):
            y = x * 3
            def backward(gy, gn):
                return gy * 3
            return (y, x.shape[0]), backward
        """,
        "tripled_and_rows",
        lambda: ([r(3, 4)], {}),
    ),
    Case(
        "an_output_that_may_be_none",
        _WITH_EXTRA,
        "with_extra",
        lambda: ([r(3, 4), True], {}),
    ),
    Case(
        "an_output_that_is_none",
        _WITH_EXTRA,
        "with_extra",
        lambda: ([r(3, 4), False], {}),
    ),
    Case(
        "a_lone_tuple_parameter_gets_its_gradients_bare",
        """
        import torch

        def pair_product(xs: tuple[torch.Tensor, ...]):
            a, b = xs
            y = a * b
            def backward(g):
                return (g * b, g * a)
            return y, backward
        """,
        "pair_product",
        lambda: ([(r(3), r(3))], {}),
    ),
    Case(
        "a_lone_list_parameter_gets_a_generator",
        """
        from typing import List
        import torch

        def total(xs: List[torch.Tensor]):
            y = torch.stack(xs).sum(0)
            def backward(g):
                return (g for _ in xs)
            return y, backward
        """,
        "total",
        lambda: ([[r(3), r(3), r(3)]], {}),
    ),
    Case(
        "parameters_requires_grad_read_in_forward",
        """
        import torch

        def gated_mul(x: torch.Tensor, w: torch.Tensor):
            need_x = x.requires_grad
            need_w = w.requires_grad
            y = x * w
            def backward(g):
                return (g * w if need_x else None), (g * x if need_w else None)
            return y, backward
        """,
        "gated_mul",
        lambda: ([r(3), r(3)], {}),
    ),
    Case(
        "two_list_outputs",
        """
        import torch

        def rows_and_columns(x: torch.Tensor):
            rows = torch.unbind(x, 0)
            cols = torch.chunk(x * 2, 3, 1)
            def backward(g_rows, g_cols):
                return torch.stack(g_rows, 0) + 2 * torch.cat(g_cols, 1)
            return rows, cols, backward
        """,
        "rows_and_columns",
        lambda: ([r(2, 3)], {}),
    ),
    Case(
        "helper_with_keyword_only_parameters",
        """
        import torch

        def _leaky(t, *, slope=0.1, scale=1.0):
            return torch.where(t > 0, t, slope * t) * scale

        def _leaky_slope(t, *, slope=0.1, scale=1.0):
            return torch.where(t > 0, torch.ones_like(t), torch.full_like(t, slope)) * scale

        def leaky_linear(x: torch.Tensor, w: torch.Tensor):
            h = x @ w
            y = _leaky(h, scale=2.0)
            def backward(g):
                gh = g * _leaky_slope(h, scale=2.0)
                return gh @ w.t(), x.t() @ gh
            return y, backward
        """,
        "leaky_linear",
        lambda: ([r(3, 4), r(4, 5)], {}),
    ),
    Case(
        "parameters_named_like_the_names_the_op_uses",
        """
        import torch

        def maybe_cast(x: torch.Tensor, cast: bool, Tensor: float = 2.0):
            t = torch.tanh(x)
            y = (t.clone() if cast else t) * Tensor
            def backward(g):
                return g * Tensor * (1 - t * t), None, None
            return y, backward
        """,
        "maybe_cast",
        lambda: ([r(2, 3), True], {}),
    ),
    Case(
        "detached_statistics_passed_to_torchs_backward_op",
        """
        import torch

        def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
            shape = [x.shape[-1]]
            out, mean, rstd = torch.native_layer_norm(x, shape, w, b, 1e-5)
            def backward(g):
                return torch.ops.aten.native_layer_norm_backward(
                    g, x, shape, mean, rstd, w, b, [True, True, True]
                )
            return out, backward
        """,
        "layer_norm",
        lambda: ([r(2, 3), r(3), r(3)], {}),
    ),
    Case(
        "augmented_assignment_on_a_name_rebound_to_a_fresh_tensor",
        """
        import torch

        def affine_tanh(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
            h = x
            h = h @ w
            h += b
            t = torch.tanh(h)
            def backward(g):
                gh = g * (1 - t * t)
                return gh @ w.t(), x.t() @ gh, gh.sum(0)
            return t, backward
        """,
        "affine_tanh",
        lambda: ([r(2, 3), r(3, 4), r(4)], {}),
    ),
    Case(
        "a_named_sub_expression_of_a_temporary_at_third_order",
        """
        import torch

        def exp_plus_one(y: torch.Tensor):
            d = y.exp() + 1.0
            def backward(g):
                return g * (d - 1.0)
            return d * 1.0, backward
        """,
        "exp_plus_one",
        lambda: ([r(2, 3)], {}),
    ),
    Case(
        "a_hand_written_logsumexp_at_third_order",
        """
        import torch

        def logsumexp(x: torch.Tensor):
            s = x.exp().sum(-1, keepdim=True)
            l = s.log()
            def backward(g):
                return g * x.exp() / s
            return l, backward
        """,
        "logsumexp",
        lambda: ([r(2, 3)], {}),
    ),
    Case(
        "a_sigmoid_inside_a_temporary_at_third_order",
        """
        import torch

        def shifted_sigmoid(y: torch.Tensor, w: torch.Tensor):
            d = y.sigmoid() * w + 1.0
            def backward(g):
                s = (d - 1.0) / w
                return g * w * s * (1 - s), (g * s).sum_to_size(w.shape)
            return d * 1.0, backward
        """,
        "shifted_sigmoid",
        lambda: ([r(2, 3), r(3)], {}),
    ),
    Case(
        "a_piece_of_a_sibling_tuple_result",
        """
        import torch

        def pair(x: torch.Tensor):
            a = x.tanh()
            b = x.exp()
            def backward(ga, gb):
                return ga * (1 - a * a) + gb * b
            return (a, b), backward

        def second_times(x: torch.Tensor, y: torch.Tensor):
            b = pair(x)[0][1]
            def backward(g):
                return pair(x)[1](torch.zeros_like(x), g * y), g * b
            return b * y, backward
        """,
        "second_times",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        "unannotated_tensors_passed_to_variadic_torch_functions",
        """
        import torch

        def bilinear(a, b):
            y = torch.einsum("ij,jk->ik", a, b)
            def backward(g):
                return torch.einsum("ik,jk->ij", g, b), torch.einsum("ij,ik->jk", a, g)
            return y, backward
        """,
        "bilinear",
        lambda: ([r(2, 3), r(3, 4)], {}),
    ),
    Case(
        "augmented_assignment_after_a_tuple_binding",
        """
        import torch

        def scaled_rows(x: torch.Tensor, alpha: float = 2.0):
            t = x.tanh()
            s, frozen = t.sum(-1, keepdim=True), t.detach()
            s *= alpha
            def backward(g):
                return (g * alpha).expand_as(x) * (1 - t * t), None
            return s, backward
        """,
        "scaled_rows",
        lambda: ([r(2, 3)], {}),
    ),
    Case(
        "backward_rebinds_its_gradient_with_a_promoted_temporary",
        """
        import torch

        def doubled_tanh(x: torch.Tensor):
            t = torch.tanh(x)
            def backward(grad):
                grad = grad * 2.0 * (1 - t * t)
                return grad
            return t * 2.0, backward
        """,
        "doubled_tanh",
        lambda: ([r(2, 3)], {}),
    ),
    Case(
        "backward_reads_its_gradient_then_rebinds_it",
        """
        import torch

        def exp_plus(x: torch.Tensor, y: torch.Tensor):
            t = torch.exp(x)
            def backward(grad):
                gy = grad
                grad = grad * t
                return grad, gy
            return t + y, backward
        """,
        "exp_plus",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        "backward_rebinds_its_gradient_once_used",
        """
        import torch

        def mul(self: torch.Tensor, other: torch.Tensor):
            def backward(grad_output):
                grad_self = grad_output * other
                grad_other = grad_output * self
                grad_output = None
                return grad_self, grad_other
            return self * other, backward
        """,
        "mul",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
    Case(
        # Issue 22: backward returns the shared centre's gradient unreduced, as PyTorch
        # allows, and a loss that holds a gradient sends the promoted `d` a gradient
        # too; the two once met at different shapes and `d`'s counted once per row.
        "unreduced_gradient_of_a_broadcast_parameter",
        """
        import torch

        def centred_square(x: torch.Tensor, centre: torch.Tensor):
            d = x - centre
            def backward(grad):
                g = 2.0 * grad * d
                return g, -g
            return d * d, backward
        """,
        "centred_square",
        lambda: ([r(4, 3), r(3)], {}),
    ),
    Case(
        "backward_returns_its_rebound_gradient_twice",
        """
        import torch

        def scaled_sum(x: torch.Tensor, y: torch.Tensor):
            def backward(grad):
                grad = grad * 2.0
                return grad, grad * 0.25
            return 2.0 * x + y * 0.5, backward
        """,
        "scaled_sum",
        lambda: ([r(2, 3), r(2, 3)], {}),
    ),
]


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[dict[str, Any], dict[str, Any], str]]:
    return {case.name: load(_dedented(case)) for case in CASES}


def _dedented(case: Case) -> Case:
    case.source = textwrap.dedent(case.source).lstrip()
    return case


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_autograd_of_the_closure_forward(case: Case, loaded) -> None:
    closure, generated, text = loaded[case.name]
    for snippet in case.generated:
        assert snippet in text, snippet
    reference = closure_forward(closure[case.function])
    op = generated[case.function]
    assert_same(
        grads(op, case),
        grads(reference, case),
        rtol=1e-7,  # torch.testing's float64 tolerances
        atol=1e-7,
        what=f"{case.name}: ",
    )


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.gradcheck and not c.random], ids=lambda c: c.name
)
def test_gradcheck_and_gradgradcheck(case: Case, loaded) -> None:
    _, generated, _ = loaded[case.name]
    op = generated[case.function]
    torch.manual_seed(0)
    args, kwargs = case.inputs()
    flat = tensors_of(args) + tensors_of(kwargs)
    if not flat:
        pytest.skip("no tensor input")

    def rebuilt(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(tensors)

        def swap(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return next(it)
            if isinstance(value, (list, tuple)):
                return type(value)(swap(v) for v in value)
            return value

        return tuple(tensors_of(op(*swap(args), **swap(kwargs))))

    assert torch.autograd.gradcheck(rebuilt, flat)
    assert torch.autograd.gradgradcheck(rebuilt, flat)


@pytest.mark.parametrize(
    "case", [c for c in CASES if not c.random], ids=lambda c: c.name
)
def test_forward_mode_matches_the_closure_forward(case: Case, loaded) -> None:
    """torch.func.jvp of the op equals jvp of the closure's own forward."""
    closure, generated, _ = loaded[case.name]
    torch.manual_seed(0)
    args, kwargs = case.inputs()
    flat = [t.detach() for t in tensors_of(args) + tensors_of(kwargs)]
    flat = [t for t in flat if t.is_floating_point()]
    if not flat:
        pytest.skip("no floating-point input")

    def of(fn: Callable[..., Any]) -> Callable[..., tuple[torch.Tensor, ...]]:
        def run(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            it = iter(tensors)

            def swap(value: Any) -> Any:
                if isinstance(value, torch.Tensor):
                    return next(it) if value.is_floating_point() else value
                if isinstance(value, (list, tuple)):
                    return type(value)(swap(v) for v in value)
                return value

            outputs = tensors_of(fn(*swap(args), **swap(kwargs)))
            return tuple(o for o in outputs if o.is_floating_point())

        return run

    tangents = tuple(torch.randn_like(t) for t in flat)
    _, want = torch.func.jvp(
        of(closure_forward(closure[case.function])), tuple(flat), tangents
    )
    _, got = torch.func.jvp(of(generated[case.function]), tuple(flat), tangents)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, msg=lambda m: f"{case.name}: tangents: {m}")


def test_list_outputs_keep_their_type(loaded) -> None:
    generated = loaded["split_output"][1]
    x = torch.randn(6, 2, dtype=F64)
    assert type(generated["halves"](x)) is tuple
    assert type(loaded["chunk_list_output"][1]["chunks"](torch.randn(6))) is list
    rows, total = loaded["unbind_and_tensor_outputs"][1]["rows_and_total"](x[:3])
    assert type(rows) is tuple and len(rows) == 3 and total.dim() == 0


def test_list_parameter_flattens_into_function_inputs(loaded) -> None:
    """The Function sees each element: every one gets its gradient."""
    generated = loaded["cat_scale"][1]
    xs = [r(2, 3), r(1, 3)]
    out = generated["cat_scale"](xs, 2.0)
    out.sum().backward()
    assert all(torch.equal(x.grad, torch.full_like(x, 2.0)) for x in xs)


FORM_FEEDS = (
    "import torch\n"
    "\f\n"
    "# Page two: a form feed above, and one inside this line \f here.\n"
    "def scaled(x: torch.Tensor):\n"
    "    t = x * 2.0\n"
    "    u = torch.sin(t)\n"
    "    def backward(grad):\n"
    "        return grad * 2.0 * torch.cos(t) * (1.0 + 0.0 * u)\n"
    "    return u * 1.0, backward\n"
)


def test_line_numbers_stay_right_after_form_feeds() -> None:
    """Python counts lines at \\n only; `str.splitlines` also breaks at form feeds."""
    text = transform(FORM_FEEDS, "ff.py", policy="promote")
    lines = FORM_FEEDS.split("\n")
    for number, statement in re.findall(r"# line (\d+): (.*)", text):
        assert lines[int(number) - 1].strip() == statement
    assert re.search(r"# line 6: u = torch\.sin\(t\)", text)
    assert "Forward of `scaled` (ff.py:4-9)" in text


@pytest.mark.parametrize("policy", ["first-order", "recompute", "promote"])
def test_a_captured_named_tuple_keeps_its_fields_under_every_policy(policy) -> None:
    """`res = x.median(dim=0)` captured whole: saved tensor by tensor, rebuilt as the
    named tuple it was (`res.indices` in backward), not as a list."""
    source = textwrap.dedent("""\
        import torch

        def median_rows(x: torch.Tensor):
            res = x.median(dim=0)
            def backward(g):
                grad = torch.zeros_like(x)
                return grad.scatter(0, res.indices.unsqueeze(0), g.unsqueeze(0))
            return res.values, backward
        """)
    _first_order_matches(
        source, "median_rows", r(3, 4), torch.randn(4, dtype=F64), policy
    )


def _converted(source: str, name: str, policy: str) -> dict[str, Any]:
    """The generated module of `source` under `policy`, run from its text."""
    generated: dict[str, Any] = {"__name__": f"{name}_grad"}
    text = transform(source, f"{name}.py", policy=policy)
    exec(compile(text, f"{name}_grad.py", "exec"), generated)
    return generated


def _first_order_matches(
    source: str, name: str, x: torch.Tensor, g: torch.Tensor, policy: str
) -> None:
    """The op `name` of `source`, converted under `policy`, has the first-order
    gradient torch.autograd gives through the closure's forward."""
    module: dict[str, Any] = {}
    exec(compile(source, f"{name}.py", "exec"), module)
    (expected,) = torch.autograd.grad(module[name](x)[0], x, g)
    (found,) = torch.autograd.grad(_converted(source, name, policy)[name](x), x, g)
    torch.testing.assert_close(found, expected)


def test_detached_statistics_are_accepted_for_a_first_order_op() -> None:
    """S2S128 guards the second order; a first-order op may read them."""
    source = (ROOT_BAD / "backward_reads_a_detached_statistic.py").read_text()
    with pytest.raises(TransformError) as caught:
        transform(source, "ln.py")
    assert [d.code for d in caught.value.diagnostics] == ["S2S128"]
    g = torch.randn(2, 3, dtype=F64)
    _first_order_matches(source, "layer_norm", r(2, 3), g, "first-order")


@pytest.mark.parametrize("policy", ["promote", "recompute"])
def test_augmented_assignment_on_a_temporary_autograd_saved(policy) -> None:
    """`h = x.exp(); h += y`: the closure cannot run under autograd itself (exp saved
    its output), but the op must: recomputation in backward runs with autograd on, so
    the generated code binds `h = h + y` instead of changing exp's output in place."""
    source = textwrap.dedent("""\
        import torch

        def shifted_sin(x: torch.Tensor, y: torch.Tensor, n: int):
            h = x.exp()
            for _ in range(n):
                h += y
            t = h.sin()
            def backward(g):
                k = g * h.cos()
                return k * x.exp(), k * n, None
            return t, backward
        """)
    generated = _converted(source, "shifted_sin", policy)
    x, y = r(2, 3), r(2, 3)
    for op in (generated["shifted_sin"], lambda x, y, n: (x.exp() + n * y).sin()):
        found = []
        grads = torch.autograd.grad(op(x, y, 2).sum(), (x, y), create_graph=True)
        for _ in range(2):
            found.append(grads)
            total = sum((g * g).sum() for g in grads)
            grads = torch.autograd.grad(total, (x, y), create_graph=True)
        found.append(grads)
        if op is generated["shifted_sin"]:
            got = found
        else:
            for mine, want in zip(got, found, strict=True):
                for a, b in zip(mine, want, strict=True):
                    torch.testing.assert_close(a, b)


def test_a_number_where_an_unannotated_parameter_takes_a_gradient() -> None:
    """`s` has no annotation and backward returns a gradient for it: a tensor, as
    TorchScript reads it. A float passed there is a clear TypeError naming `s` and the
    annotation that accepts numbers, not `save_for_backward`'s; with that annotation
    the op takes both and matches autograd through the closure's forward."""
    source = textwrap.dedent("""\
        import torch

        def scaled_square(x, s):
            t = x * s
            y = t * t
            def backward(g):
                return 2 * g * t * s, (2 * g * t * x).sum()
            return y, backward
        """)
    op = _converted(source, "scaled_square", "promote")["scaled_square"]
    with pytest.raises(
        TypeError, match=r"`s` as a tensor; got 2\.0\. .*Tensor \| float"
    ):
        op(r(2, 3), 2.0)
    annotated = source.replace("(x, s)", "(x, s: torch.Tensor | float)")
    module: dict[str, Any] = {}
    exec(compile(annotated, "scaled_square.py", "exec"), module)
    op = _converted(annotated, "scaled_square", "promote")["scaled_square"]
    for s in (2.0, 3, r()):
        x = r(2, 3)
        inputs = (x, s) if isinstance(s, torch.Tensor) else (x,)
        for f in (op, lambda x, s: module["scaled_square"](x, s)[0]):
            first = torch.autograd.grad(f(x, s).sum(), inputs, create_graph=True)
            second = torch.autograd.grad(sum(g.sum() for g in first), inputs)
            if f is op:
                found = first + second
            else:
                for a, b in zip(found, first + second, strict=True):
                    torch.testing.assert_close(a, b)


RECOMPUTE_WITH_AUTOGRAD = """
import torch


def sin_x(x: torch.Tensor):
    def backward(g):
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            y = torch.sin(leaf) * leaf
            (gx,) = torch.autograd.grad(y, leaf, g)
        return gx
    return torch.sin(x) * x, backward
"""


def test_a_backward_that_differentiates_a_detached_copy() -> None:
    """`x.detach().requires_grad_()` sets a flag of the new tensor, not of `x`: the
    checkpoint-style backward converts and is right at first order (a second order
    is not differentiable as written, which `check_gradients` reports)."""
    g = torch.randn(2, 3, dtype=F64)
    _first_order_matches(RECOMPUTE_WITH_AUTOGRAD, "sin_x", r(2, 3), g, "promote")
    mutating = RECOMPUTE_WITH_AUTOGRAD.replace(
        "x.detach().requires_grad_()", "x.requires_grad_()"
    )
    with pytest.raises(TransformError) as caught:
        transform(mutating, "sin_x.py")
    assert [d.code for d in caught.value.diagnostics] == ["S2S103"]
