# mypy: ignore-errors
"""Derivative rules for the primitive PyTorch operations s2sgrad understands.

Every rule is a *differentiator* written in closure style::

    def mul(a, other):
        out = a * other
        def backward(grad):
            return (grad * other).sum_to_size(a.shape), (grad * a).sum_to_size(other.shape)
        return out, backward

The frontend parses these functions and inlines them into generated code, so
each rule keeps to a narrow format:

* the body is an optional docstring, ``out = <one expression applying the op
  to the parameters>``, ``def backward(grad):`` and ``return out, backward``;
* ``backward`` takes the single parameter ``grad``; its body holds simple
  assignments to local names, ``if``/``else`` on non-tensor values (dims,
  flags, ranks; no ``elif``, which the inliner cannot fold) and conditional
  expressions, and ends with the one and only ``return``: a tuple with one
  entry per rule parameter, in order (a bare expression for a one-parameter
  rule);
* the entry of a parameter that never gets a gradient (dims, flags, indices,
  conditions, dtypes) is the literal ``None``; every other entry must be
  computable on its own, because the generator keeps only the entries (and
  the locals they use) that it needs -- and it only asks for the entries of
  tensor operands, so an entry may freely use ``.shape`` of its own
  parameter while any other operand may be a Python scalar; an entry is
  lifted out of the tuple, so it must not break lines outside its own
  brackets;
* ``backward`` reads only ``grad``, the rule's parameters, ``out``, its own
  locals, ``torch``, ``math``, builtins and the helpers it imports from
  ``s2sgrad.runtime`` (which generated modules import too) -- never a helper of
  this module;
* everything in ``backward`` is made of differentiable out-of-place torch
  operations that themselves have rules here (comparison masks, shapes and
  constant factories aside), so the inlined backward can be differentiated
  again for higher-order derivatives;
* parameters past the first use PyTorch's own keyword names and defaults, so
  keyword calls bind to the rule.

Rules whose output is a sequence of tensors (``split``, ``unbind``) receive
``grad`` as a sequence aligned with ``out`` (an entry may be ``None`` for an
unused output).

``RULES`` maps qualified names (``operator.add``, ``torch.exp``,
``torch.Tensor.exp``, ``torch.nn.functional.relu``, ...) to rules; the
receiver of a ``torch.Tensor.<name>`` method binds to the first parameter.
``VARARGS`` names the methods whose PyTorch spelling takes varargs
(``x.view(2, 3)``) and the rule parameter that collects the remaining
positional arguments as a tuple (a single tuple/list argument is accepted
there too, as in PyTorch).

To add a rule, write its function here and add its ``RULES`` entries (and
``VARARGS`` entries for varargs methods), then give it an example in
``tests/test_rules_closures.py``.
"""
import math

import torch

from s2sgrad.runtime import _matmul_grad_other, _matmul_grad_x

# --------------------------------------------------------------------------
# Elementwise arithmetic (operands may be Python scalars).
# --------------------------------------------------------------------------


def add(x: torch.Tensor | float, other: torch.Tensor | float):
    """x + other (broadcasting)."""
    out = x + other
    def backward(grad):
        return grad.sum_to_size(x.shape), grad.sum_to_size(other.shape)
    return out, backward


def sub(x: torch.Tensor | float, other: torch.Tensor | float):
    """x - other (broadcasting)."""
    out = x - other
    def backward(grad):
        return grad.sum_to_size(x.shape), (-grad).sum_to_size(other.shape)
    return out, backward


def mul(x: torch.Tensor | float, other: torch.Tensor | float):
    """x * other (broadcasting)."""
    out = x * other
    def backward(grad):
        return (grad * other).sum_to_size(x.shape), (grad * x).sum_to_size(other.shape)
    return out, backward


def div(x: torch.Tensor | float, other: torch.Tensor | float):
    """True division x / other (broadcasting)."""
    out = x / other
    def backward(grad):
        return (
            (grad / other).sum_to_size(x.shape),
            (-grad * x / (other * other)).sum_to_size(other.shape),
        )
    return out, backward


def neg(x):
    """Unary minus."""
    out = -x
    def backward(grad):
        return -grad
    return out, backward


def pow_(x: torch.Tensor | float, exponent: torch.Tensor | float):
    """x ** exponent; either operand may be a tensor or a Python scalar.

    As PyTorch's pow_backward: an exponent of 0 gives x no gradient (not
    `0 * x ** -1`, nan where x is 0), and a base of 0 gives the exponent none where
    the exponent is not negative (not `0 * log(0)`); a Python base that is not
    positive has the logarithm C gives it, not math's ValueError.
    """
    out = x ** exponent
    def backward(grad):
        if isinstance(exponent, torch.Tensor):
            # The power is x ** 0 where the exponent is 0, so that no nan comes back
            # through the branch torch.where does not take.
            zero = exponent == 0
            grad_x = torch.where(zero, 0.0, grad * exponent * x ** (exponent - 1 + zero))
        else:
            grad_x = grad * exponent * x ** (exponent - 1) if exponent != 0 else grad * 0.0
        if isinstance(x, torch.Tensor):
            # As pow_backward_exponent: no gradient where x == 0 and exponent >= 0
            # (0 * log(0) is nan), and log(1) there so that none comes back either.
            zero_base = (x == 0) & (exponent >= 0)
            log_x = torch.where(zero_base, 0.0, torch.log(torch.where(zero_base, 1.0, x)))
        else:
            # log(0) is -inf, but 0 ** e has no gradient in e >= 0 (a factor 0, so
            # that no nan comes back through it either).
            log_x = (
                math.log(x) if x > 0
                else math.nan if x < 0
                else torch.where(exponent >= 0, 0.0, -math.inf)
            )
        return grad_x.sum_to_size(x.shape), (grad * out * log_x).sum_to_size(exponent.shape)
    return out, backward


# --------------------------------------------------------------------------
# Matrix products.
# --------------------------------------------------------------------------


def matmul(x, other):
    """x @ other with NumPy semantics: 1-D operands and broadcast batch dims, which the
    runtime's `_matmul_grad_x` and `_matmul_grad_other` promote and sum."""
    out = x @ other
    def backward(grad):
        return _matmul_grad_x(grad, x, other), _matmul_grad_other(grad, x, other)
    return out, backward


def mm(x, mat2):
    """Matrix product of two 2-D tensors (torch.mm)."""
    out = torch.mm(x, mat2)
    def backward(grad):
        return grad @ mat2.transpose(-2, -1), x.transpose(-2, -1) @ grad
    return out, backward


def bmm(x, mat2):
    """Batched matrix product of two 3-D tensors (torch.bmm)."""
    out = torch.bmm(x, mat2)
    def backward(grad):
        return grad @ mat2.transpose(-2, -1), x.transpose(-2, -1) @ grad
    return out, backward


# --------------------------------------------------------------------------
# Unary elementwise functions.
# --------------------------------------------------------------------------


def exp(x):
    out = torch.exp(x)
    def backward(grad):
        return grad * out
    return out, backward


def log(x):
    out = torch.log(x)
    def backward(grad):
        return grad / x
    return out, backward


def log1p(x):
    out = torch.log1p(x)
    def backward(grad):
        return grad / (x + 1.0)
    return out, backward


def expm1(x):
    out = torch.expm1(x)
    def backward(grad):
        return grad * (out + 1.0)
    return out, backward


def sqrt(x):
    out = torch.sqrt(x)
    def backward(grad):
        return grad / (2.0 * out)
    return out, backward


def rsqrt(x):
    out = torch.rsqrt(x)
    def backward(grad):
        return -0.5 * grad * out ** 3
    return out, backward


def abs_(x):
    """|x|; the gradient at 0 is 0, as in PyTorch."""
    out = torch.abs(x)
    def backward(grad):
        return grad * torch.sign(x)
    return out, backward


def sin(x):
    out = torch.sin(x)
    def backward(grad):
        return grad * torch.cos(x)
    return out, backward


def cos(x):
    out = torch.cos(x)
    def backward(grad):
        return -(grad * torch.sin(x))
    return out, backward


def tanh(x):
    out = torch.tanh(x)
    def backward(grad):
        return grad * (1.0 - out * out)
    return out, backward


def sigmoid(x):
    out = torch.sigmoid(x)
    def backward(grad):
        return grad * out * (1.0 - out)
    return out, backward


def erf(x):
    out = torch.erf(x)
    def backward(grad):
        return grad * (2.0 / math.sqrt(math.pi)) * torch.exp(-(x * x))
    return out, backward


def relu(x):
    out = torch.relu(x)
    def backward(grad):
        return torch.where(out > 0, grad, 0.0)
    return out, backward


def gelu(x, approximate="none"):
    """GELU, exact (erf) or with the tanh approximation."""
    out = torch.nn.functional.gelu(x, approximate=approximate)
    def backward(grad):
        if approximate == "tanh":
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
            th = torch.tanh(inner)
            slope = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * (
                math.sqrt(2.0 / math.pi) * (1.0 + 3.0 * 0.044715 * x * x)
            )
        else:
            slope = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0)))) + x * (
                1.0 / math.sqrt(2.0 * math.pi)
            ) * torch.exp(-0.5 * x * x)
        return grad * slope, None
    return out, backward


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta * x)) / beta, linear where beta * x > threshold."""
    out = torch.nn.functional.softplus(x, beta=beta, threshold=threshold)
    def backward(grad):
        return torch.where(x * beta > threshold, grad, grad * torch.sigmoid(x * beta)), None, None
    return out, backward


def clamp(x, min: torch.Tensor | float | None = None, max: torch.Tensor | float | None = None):
    """Clamp to [min, max]; either bound may be None, a scalar or a tensor."""
    out = torch.clamp(x, min=min, max=max)
    def backward(grad):
        grad_low = grad if min is None else torch.where(x >= min, grad, 0.0)
        grad_x = grad_low if max is None else torch.where(x <= max, grad_low, 0.0)
        # As clamp_backward_min_max: where min > max the result is max everywhere.
        below = x < min if max is None else (x < min) & (min < max)
        above = x > max if min is None else (x > max) | (max < min)
        return (
            grad_x.sum_to_size(x.shape),
            torch.where(below, grad, 0.0).sum_to_size(min.shape),
            torch.where(above, grad, 0.0).sum_to_size(max.shape),
        )
    return out, backward


# --------------------------------------------------------------------------
# Selection between operands.
# --------------------------------------------------------------------------


def where(condition, input: torch.Tensor | float, other: torch.Tensor | float):
    """torch.where(condition, input, other); input/other may be scalars."""
    out = torch.where(condition, input, other)
    def backward(grad):
        return (
            None,
            torch.where(condition, grad, 0.0).sum_to_size(input.shape),
            torch.where(condition, 0.0, grad).sum_to_size(other.shape),
        )
    return out, backward


def tensor_where(input, condition, other: torch.Tensor | float):
    """input.where(condition, other), the method spelling of torch.where."""
    out = torch.where(condition, input, other)
    def backward(grad):
        return (
            torch.where(condition, grad, 0.0).sum_to_size(input.shape),
            None,
            torch.where(condition, 0.0, grad).sum_to_size(other.shape),
        )
    return out, backward


def maximum(x: torch.Tensor | float, other: torch.Tensor | float):
    """Elementwise maximum; ties split the gradient equally, as in PyTorch."""
    out = torch.maximum(x, other)
    def backward(grad):
        tied = torch.where(x == other, grad / 2, 0.0)
        return (
            torch.where(x > other, grad, tied).sum_to_size(x.shape),
            torch.where(other > x, grad, tied).sum_to_size(other.shape),
        )
    return out, backward


def minimum(x: torch.Tensor | float, other: torch.Tensor | float):
    """Elementwise minimum; ties split the gradient equally, as in PyTorch."""
    out = torch.minimum(x, other)
    def backward(grad):
        tied = torch.where(x == other, grad / 2, 0.0)
        return (
            torch.where(x < other, grad, tied).sum_to_size(x.shape),
            torch.where(other < x, grad, tied).sum_to_size(other.shape),
        )
    return out, backward


def masked_fill(x, mask, value: torch.Tensor | float):
    """x.masked_fill(mask, value); value may be a scalar or a 0-dim tensor."""
    out = torch.masked_fill(x, mask, value)
    def backward(grad):
        return (
            grad.masked_fill(mask, 0.0).sum_to_size(x.shape),
            None,
            torch.where(mask, grad, 0.0).sum(),
        )
    return out, backward


# --------------------------------------------------------------------------
# Reductions.  dim may be None, an int or a tuple/list of ints.
# --------------------------------------------------------------------------


def sum_(x, dim=None, keepdim=False):
    out = torch.sum(x, dim=dim, keepdim=keepdim)
    def backward(grad):
        if dim is None or keepdim:
            grad_x = grad.expand(x.shape)
        else:
            if isinstance(dim, int):
                grad_x = (grad.unsqueeze(dim) if x.dim() else grad).expand(x.shape)
            else:
                dims = [d % max(x.ndim, 1) for d in dim]
                keep_shape = [1 if i in dims or len(dims) == 0 else s for i, s in enumerate(x.shape)]
                grad_x = grad.reshape(keep_shape).expand(x.shape)
        return grad_x, None, None
    return out, backward


def mean(x, dim=None, keepdim=False):
    out = torch.mean(x, dim=dim, keepdim=keepdim)
    def backward(grad):
        if dim is None or keepdim:
            grad_keep = grad
        else:
            if isinstance(dim, int):
                grad_keep = grad.unsqueeze(dim) if x.dim() else grad
            else:
                dims = [d % max(x.ndim, 1) for d in dim]
                keep_shape = [1 if i in dims or len(dims) == 0 else s for i, s in enumerate(x.shape)]
                grad_keep = grad.reshape(keep_shape)
        count = x.numel() / max(out.numel(), 1)
        return (grad_keep / count).expand(x.shape), None, None
    return out, backward


def var(x, dim=None, correction=1, keepdim=False):
    """Variance with Bessel-style correction (correction=1 is unbiased). A bool in
    `dim`'s place is torch's `var(x, unbiased)` overload: all dims, correction 0 or 1."""
    out = torch.var(x, dim=dim, correction=correction, keepdim=keepdim)
    def backward(grad):
        if isinstance(dim, bool):
            whole = x.numel()
            bessel = 2.0 / (whole - int(dim)) if whole > int(dim) else math.inf
            grad_x = grad * (x - torch.mean(x)) * bessel
        else:
            if dim is None or keepdim:
                grad_keep = grad
            else:
                if isinstance(dim, int):
                    grad_keep = grad.unsqueeze(dim) if x.dim() else grad
                else:
                    dims = [d % max(x.ndim, 1) for d in dim]
                    keep_shape = [1 if i in dims or len(dims) == 0 else s for i, s in enumerate(x.shape)]
                    grad_keep = grad.reshape(keep_shape)
            count = x.numel() // max(out.numel(), 1)
            scale = 2.0 / (count - correction) if count > correction else math.inf
            grad_x = grad_keep * (x - torch.mean(x, dim=dim, keepdim=True)) * scale
        return grad_x, None, None, None
    return out, backward


def amax(x, dim=(), keepdim=False):
    """Maximum over dim (all dims by default); ties share the gradient equally."""
    out = torch.amax(x, dim=dim, keepdim=keepdim)
    def backward(grad):
        if keepdim:
            grad_keep = grad
            out_keep = out
        else:
            if isinstance(dim, int):
                grad_keep = grad.unsqueeze(dim) if x.dim() else grad
                out_keep = out.unsqueeze(dim) if x.dim() else out
            else:
                dims = [d % max(x.ndim, 1) for d in dim]
                keep_shape = [1 if i in dims or len(dims) == 0 else s for i, s in enumerate(x.shape)]
                grad_keep = grad.reshape(keep_shape)
                out_keep = out.reshape(keep_shape)
        is_max = x == out_keep
        return torch.where(is_max, grad_keep / is_max.sum(dim=dim, keepdim=True), 0.0), None, None
    return out, backward


def softmax(x, dim):
    """softmax over dim; F.softmax's `dim=None` is its implicit dim (as
    `_get_softmax_dim`: 0 for 0, 1 or 3 dims, else 1)."""
    out = torch.softmax(x, dim)
    def backward(grad):
        over = dim if dim is not None else (0 if x.dim() in (0, 1, 3) else 1)
        return out * (grad - (grad * out).sum(over, keepdim=True)), None
    return out, backward


def log_softmax(x, dim):
    """log_softmax over dim; `dim=None` is F.log_softmax's implicit dim (as softmax)."""
    out = torch.log_softmax(x, dim)
    def backward(grad):
        over = dim if dim is not None else (0 if x.dim() in (0, 1, 3) else 1)
        return grad - torch.exp(out) * grad.sum(over, keepdim=True), None
    return out, backward


# --------------------------------------------------------------------------
# Shape and layout.
# --------------------------------------------------------------------------


def transpose(x, dim0, dim1):
    out = torch.transpose(x, dim0, dim1)
    def backward(grad):
        return grad.transpose(dim0, dim1), None, None
    return out, backward


def t(x):
    out = torch.t(x)
    def backward(grad):
        return grad.t()
    return out, backward


def permute(x, dims):
    """x.permute(dims); dims is a tuple of ints or a 1-tuple holding one."""
    out = x.permute(*dims)
    def backward(grad):
        perm = [
            d % x.ndim
            for d in (dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)
        ]
        return grad.permute([perm.index(i) for i in range(x.ndim)]), None
    return out, backward


def reshape(x, shape):
    out = x.reshape(*shape)
    def backward(grad):
        return grad.reshape(x.shape), None
    return out, backward


def view(x, size):
    """x.view(*size); `x.view(dtype)` reinterprets the bits, which passes no gradient
    (PyTorch's view.dtype is not differentiable, even to the same dtype)."""
    out = x.view(*size)
    def backward(grad):
        bits = len(size) == 1 and isinstance(size[0], torch.dtype)
        return torch.zeros_like(x) if bits else grad.reshape(x.shape), None
    return out, backward


def flatten(x, start_dim=0, end_dim=-1):
    out = torch.flatten(x, start_dim, end_dim)
    def backward(grad):
        return grad.reshape(x.shape), None, None
    return out, backward


def unsqueeze(x, dim):
    out = torch.unsqueeze(x, dim)
    def backward(grad):
        return grad.reshape(x.shape), None
    return out, backward


def squeeze(x, dim=None):
    out = torch.squeeze(x) if dim is None else torch.squeeze(x, dim)
    def backward(grad):
        return grad.reshape(x.shape), None
    return out, backward


def expand(x, size):
    out = x.expand(*size)
    def backward(grad):
        return grad.sum_to_size(x.shape), None
    return out, backward


def expand_as(x, other):
    out = x.expand_as(other)
    def backward(grad):
        return grad.sum_to_size(x.shape), None
    return out, backward


def broadcast_to(x, size):
    out = torch.broadcast_to(x, size)
    def backward(grad):
        return grad.sum_to_size(x.shape), None
    return out, backward


def sum_to_size(x, size):
    out = x.sum_to_size(*size)
    def backward(grad):
        return grad.expand(x.shape), None
    return out, backward


def tril(x, diagonal=0):
    out = torch.tril(x, diagonal)
    def backward(grad):
        return grad.tril(diagonal), None
    return out, backward


def triu(x, diagonal=0):
    out = torch.triu(x, diagonal)
    def backward(grad):
        return grad.triu(diagonal), None
    return out, backward


# --------------------------------------------------------------------------
# Joining, splitting and indexing.
# --------------------------------------------------------------------------


def cat(tensors: list[torch.Tensor], dim=0):
    """torch.cat; a legacy empty operand (shape (0,)) is skipped, as torch skips it,
    and gets an empty gradient."""
    out = torch.cat(tensors, dim)
    def backward(grad):
        pieces = torch.split(grad, [0 if t.shape == (0,) else t.shape[dim] for t in tensors], dim)
        return [
            torch.zeros_like(t) if t.shape == (0,) else p
            for p, t in zip(pieces, tensors, strict=True)
        ], None
    return out, backward


def stack(tensors: list[torch.Tensor], dim=0):
    out = torch.stack(tensors, dim)
    def backward(grad):
        return grad.unbind(dim), None
    return out, backward


def split(x, split_size_or_sections, dim=0):
    """torch.split; grad is a sequence aligned with the output pieces."""
    out = torch.split(x, split_size_or_sections, dim)
    def backward(grad):
        pieces = [torch.zeros_like(o) if g is None else g for g, o in zip(grad, out, strict=True)]
        return torch.cat(pieces, dim), None, None
    return out, backward


def unbind(x, dim=0):
    """torch.unbind; grad is a sequence aligned with the output slices."""
    out = torch.unbind(x, dim)
    def backward(grad):
        slices = [torch.zeros_like(o) if g is None else g for g, o in zip(grad, out, strict=True)]
        return torch.stack(slices, dim), None
    return out, backward


def index_select(x, dim, index):
    out = torch.index_select(x, dim, index)
    def backward(grad):
        return torch.zeros_like(x).index_add(dim, index, grad), None, None
    return out, backward


def index_add(x, dim, index, source, alpha=1):
    """Out-of-place x.index_add(dim, index, source, alpha=alpha)."""
    out = torch.index_add(x, dim, index, source, alpha=alpha)
    def backward(grad):
        return (
            grad,
            None,
            None,
            grad.index_select(dim, index) if alpha == 1 else grad.index_select(dim, index) * alpha,
            None,
        )
    return out, backward


def gather(x, dim, index):
    out = torch.gather(x, dim, index)
    def backward(grad):
        return torch.zeros_like(x).scatter_add(dim, index, grad), None, None
    return out, backward


def scatter_add(x, dim, index, src):
    """Out-of-place x.scatter_add(dim, index, src)."""
    out = torch.scatter_add(x, dim, index, src)
    def backward(grad):
        return grad, None, None, grad.gather(dim, index)
    return out, backward


def narrow(x, dim, start, length):
    out = torch.narrow(x, dim, start, length)
    def backward(grad):
        begin = start if start >= 0 else start + x.shape[dim]
        return torch.zeros_like(x).slice_scatter(grad, dim, begin, begin + length), None, None, None
    return out, backward


def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """Out-of-place: x with x[..., start:end:step, ...] (along dim) replaced by src."""
    out = torch.slice_scatter(x, src, dim, start, end, step)
    def backward(grad):
        return (
            grad.slice_scatter(torch.zeros_like(src), dim, start, end, step),
            grad[(slice(None),) * (dim % grad.ndim) + (slice(start, end, step),)],
            None,
            None,
            None,
            None,
        )
    return out, backward


def getitem(x, index):
    """x[index] for constant indices (ints, slices, None, Ellipsis, tuples, index tensors)."""
    out = x[index]
    def backward(grad):
        # Flat positions of the selected elements; index_add accumulates repeated ones.
        positions = torch.arange(x.numel(), device=x.device).reshape(x.shape)[index]
        grad_flat = torch.zeros(x.numel(), dtype=grad.dtype, device=grad.device).index_add(
            0, positions.reshape(-1), grad.reshape(-1)
        )
        return grad_flat.reshape(x.shape), None
    return out, backward


# --------------------------------------------------------------------------
# Conversions, copies and gradient barriers.
# --------------------------------------------------------------------------


def to(x, args, non_blocking=False, copy=False):
    """x.to(*args): dtype/device conversion; the gradient goes back to x's dtype and
    device. A conversion to an integer or bool dtype passes no gradient, as in
    PyTorch (zeros: the gradient it would pass is the truncated one)."""
    out = x.to(*args, non_blocking=non_blocking, copy=copy)
    def backward(grad):
        passes = out.dtype.is_floating_point or out.dtype.is_complex
        return grad.to(x.device, x.dtype) if passes else torch.zeros_like(x), None, None, None
    return out, backward


def type_as(x, other):
    """x.type_as(other); to an integer or bool dtype it passes no gradient (as `to`)."""
    out = x.type_as(other)
    def backward(grad):
        passes = out.dtype.is_floating_point or out.dtype.is_complex
        return grad.to(x.device, x.dtype) if passes else torch.zeros_like(x), None
    return out, backward


def contiguous(x):
    out = x.contiguous()
    def backward(grad):
        return grad
    return out, backward


def clone(x):
    out = torch.clone(x)
    def backward(grad):
        return grad
    return out, backward


def detach(x):
    out = torch.detach(x)
    def backward(grad):
        return None
    return out, backward


def zeros_like(x):
    out = torch.zeros_like(x)
    def backward(grad):
        return None
    return out, backward


def ones_like(x):
    out = torch.ones_like(x)
    def backward(grad):
        return None
    return out, backward


# --------------------------------------------------------------------------
# Comparisons and boolean logic: no gradient.
# --------------------------------------------------------------------------


def eq(x, other):
    out = x == other
    def backward(grad):
        return None, None
    return out, backward


def ne(x, other):
    out = x != other
    def backward(grad):
        return None, None
    return out, backward


def lt(x, other):
    out = x < other
    def backward(grad):
        return None, None
    return out, backward


def le(x, other):
    out = x <= other
    def backward(grad):
        return None, None
    return out, backward


def gt(x, other):
    out = x > other
    def backward(grad):
        return None, None
    return out, backward


def ge(x, other):
    out = x >= other
    def backward(grad):
        return None, None
    return out, backward


def and_(x: torch.Tensor, other: torch.Tensor | bool):
    out = x & other
    def backward(grad):
        return None, None
    return out, backward


def or_(x: torch.Tensor, other: torch.Tensor | bool):
    out = x | other
    def backward(grad):
        return None, None
    return out, backward


def xor(x: torch.Tensor, other: torch.Tensor | bool):
    out = x ^ other
    def backward(grad):
        return None, None
    return out, backward


def invert(x: torch.Tensor):
    out = ~x
    def backward(grad):
        return None
    return out, backward


# --------------------------------------------------------------------------
# Registry.
# --------------------------------------------------------------------------


RULES = {
    # arithmetic
    "operator.add": add, "torch.add": add, "torch.Tensor.add": add,
    "operator.sub": sub, "torch.sub": sub, "torch.subtract": sub,
    "torch.Tensor.sub": sub, "torch.Tensor.subtract": sub,
    "operator.mul": mul, "torch.mul": mul, "torch.multiply": mul,
    "torch.Tensor.mul": mul, "torch.Tensor.multiply": mul,
    "operator.truediv": div, "torch.div": div, "torch.divide": div,
    "torch.true_divide": div, "torch.Tensor.div": div, "torch.Tensor.divide": div,
    "torch.Tensor.true_divide": div,
    "operator.neg": neg, "torch.neg": neg, "torch.negative": neg,
    "torch.Tensor.neg": neg, "torch.Tensor.negative": neg,
    "operator.pow": pow_, "torch.pow": pow_, "torch.Tensor.pow": pow_,
    # matrix products
    "operator.matmul": matmul, "torch.matmul": matmul, "torch.Tensor.matmul": matmul,
    "torch.mm": mm, "torch.Tensor.mm": mm,
    "torch.bmm": bmm, "torch.Tensor.bmm": bmm,
    # unary
    "torch.exp": exp, "torch.Tensor.exp": exp,
    "torch.log": log, "torch.Tensor.log": log,
    "torch.log1p": log1p, "torch.Tensor.log1p": log1p,
    "torch.special.log1p": log1p,
    "torch.expm1": expm1, "torch.Tensor.expm1": expm1,
    "torch.special.expm1": expm1,
    "torch.sqrt": sqrt, "torch.Tensor.sqrt": sqrt,
    "torch.rsqrt": rsqrt, "torch.Tensor.rsqrt": rsqrt,
    "torch.abs": abs_, "torch.absolute": abs_, "torch.Tensor.abs": abs_,
    "torch.Tensor.absolute": abs_,
    "torch.sin": sin, "torch.Tensor.sin": sin,
    "torch.cos": cos, "torch.Tensor.cos": cos,
    "torch.tanh": tanh, "torch.Tensor.tanh": tanh, "torch.nn.functional.tanh": tanh,
    "torch.sigmoid": sigmoid, "torch.Tensor.sigmoid": sigmoid,
    "torch.nn.functional.sigmoid": sigmoid,
    "torch.special.expit": sigmoid,
    "torch.erf": erf, "torch.Tensor.erf": erf,
    "torch.special.erf": erf,
    "torch.relu": relu, "torch.Tensor.relu": relu, "torch.nn.functional.relu": relu,
    "torch.nn.functional.gelu": gelu,
    "torch.nn.functional.softplus": softplus,
    "torch.clamp": clamp, "torch.clamp_min": clamp, "torch.clip": clamp,
    "torch.Tensor.clamp": clamp, "torch.Tensor.clamp_min": clamp,
    "torch.Tensor.clip": clamp,
    # selection
    "torch.where": where,
    "torch.Tensor.where": tensor_where,
    "torch.maximum": maximum, "torch.Tensor.maximum": maximum,
    "torch.minimum": minimum, "torch.Tensor.minimum": minimum,
    "torch.masked_fill": masked_fill, "torch.Tensor.masked_fill": masked_fill,
    # reductions
    "torch.sum": sum_, "torch.Tensor.sum": sum_,
    "torch.mean": mean, "torch.Tensor.mean": mean,
    "torch.var": var, "torch.Tensor.var": var,
    "torch.amax": amax, "torch.Tensor.amax": amax,
    "torch.softmax": softmax, "torch.Tensor.softmax": softmax,
    "torch.nn.functional.softmax": softmax,
    "torch.special.softmax": softmax,
    "torch.log_softmax": log_softmax, "torch.Tensor.log_softmax": log_softmax,
    "torch.nn.functional.log_softmax": log_softmax,
    "torch.special.log_softmax": log_softmax,
    # shape and layout
    "torch.swapdims": transpose, "torch.transpose": transpose,
    "torch.Tensor.swapdims": transpose, "torch.Tensor.transpose": transpose,
    "torch.t": t, "torch.Tensor.t": t,
    "torch.permute": permute, "torch.Tensor.permute": permute,
    "torch.reshape": reshape, "torch.Tensor.reshape": reshape,
    "torch.Tensor.view": view,
    "torch.flatten": flatten, "torch.Tensor.flatten": flatten,
    "torch.unsqueeze": unsqueeze, "torch.Tensor.unsqueeze": unsqueeze,
    "torch.squeeze": squeeze, "torch.Tensor.squeeze": squeeze,
    "torch.Tensor.expand": expand,
    "torch.Tensor.expand_as": expand_as,
    "torch.broadcast_to": broadcast_to, "torch.Tensor.broadcast_to": broadcast_to,
    "torch.Tensor.sum_to_size": sum_to_size,
    "torch.tril": tril, "torch.Tensor.tril": tril,
    "torch.triu": triu, "torch.Tensor.triu": triu,
    # joining, splitting, indexing
    "torch.cat": cat, "torch.concat": cat,
    "torch.stack": stack,
    "torch.split": split, "torch.Tensor.split": split,
    "torch.unbind": unbind, "torch.Tensor.unbind": unbind,
    "torch.index_select": index_select, "torch.Tensor.index_select": index_select,
    "torch.index_add": index_add, "torch.Tensor.index_add": index_add,
    "torch.gather": gather, "torch.Tensor.gather": gather,
    "torch.scatter_add": scatter_add, "torch.Tensor.scatter_add": scatter_add,
    "torch.narrow": narrow, "torch.Tensor.narrow": narrow,
    "torch.slice_scatter": slice_scatter, "torch.Tensor.slice_scatter": slice_scatter,
    "operator.getitem": getitem,
    "torch.Tensor.__getitem__": getitem,
    # conversions and copies
    "torch.Tensor.to": to,
    "torch.Tensor.type_as": type_as,
    "torch.Tensor.contiguous": contiguous,
    "torch.clone": clone, "torch.Tensor.clone": clone,
    "torch.detach": detach, "torch.Tensor.detach": detach,
    "torch.zeros_like": zeros_like,
    "torch.ones_like": ones_like,
    # comparisons and boolean logic
    "operator.eq": eq, "torch.eq": eq, "torch.Tensor.eq": eq,
    "operator.ne": ne, "torch.ne": ne, "torch.Tensor.ne": ne,
    "operator.lt": lt, "torch.lt": lt, "torch.Tensor.lt": lt,
    "operator.le": le, "torch.le": le, "torch.Tensor.le": le,
    "operator.gt": gt, "torch.gt": gt, "torch.Tensor.gt": gt,
    "operator.ge": ge, "torch.ge": ge, "torch.Tensor.ge": ge,
    "operator.and_": and_,
    "operator.or_": or_,
    "operator.xor": xor,
    "operator.invert": invert,
}

VARARGS = {
    "torch.Tensor.reshape": "shape",
    "torch.Tensor.view": "size",
    "torch.Tensor.permute": "dims",
    "torch.Tensor.expand": "size",
    "torch.Tensor.sum_to_size": "size",
    "torch.Tensor.to": "args",
}
