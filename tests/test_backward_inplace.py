"""Backward's in-place writes to tensors backward made, written out of place.

Backward runs again under autograd at every order past the first. An in-place op there
on a tensor an earlier op saved (`d = torch.sigmoid(x); d.mul_(1 - d)`: sigmoid saved
its output) made every second-order use of the op fail autograd's version check,
though the first order was right; and a store of the incoming gradient into a tensor
backward filled (`gx = torch.zeros_like(x); gx[m] = ...`) made jacrev and hessian fail,
since vmap cannot store a batched value into an unbatched tensor. Each case converts and
matches torch.autograd through the closure's own forward at orders 1 to 3, pure and
mixed, with a (4,) weight broadcast against (3, 4) x and its gradient returned
unreduced, with every input requiring grad and with only one of them.
"""

from __future__ import annotations

import pytest
import torch
from test_outside_python import _check, _r, _refused

HEAD = "import torch\nimport torch.nn.functional as F\n\n\n"

CASES = {
    # sigmoid saved `d`, which mul_ changes.
    "method": """
def f(x: torch.Tensor, w: torch.Tensor):
    s = torch.sigmoid(x)
    def backward(g):
        d = torch.sigmoid(x)
        d.mul_(1 - d)
        return g * w * d, g * s
    return s * w, backward
""",
    "chain": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        d = torch.tanh(x)
        d.pow_(2).neg_().add_(1)
        return g * w * d, g * t
    return t * w, backward
""",
    # exp saved `s`, which sigmoid_ changes.
    "function": """
def f(x: torch.Tensor, w: torch.Tensor):
    y = torch.sigmoid(torch.exp(x))
    def backward(g):
        s = torch.exp(x)
        torch.sigmoid_(s)
        return g * w * s * (1 - s) * torch.exp(x), g * s
    return y * w, backward
""",
    "augmented": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = torch.exp(x)
        d *= w
        return g * d, g * torch.exp(x)
    return torch.exp(x) * w, backward
""",
    "store": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        gx = torch.zeros_like(x)
        m = x > 0
        d = g * w * (1 - t * t)
        gx[m] = d[m]
        gx[~m] = d[~m]
        return gx, g * t
    return t * w, backward
""",
    "augmented store in a loop": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sin(x)
    def backward(g):
        gx = torch.zeros_like(x)
        for i in range(x.shape[0]):
            gx[i] += g[i] * w * torch.cos(x[i])
        return gx, g * t
    return t * w, backward
""",
    # A later call of the chain reads what the earlier one made: `d + d` is 4x.
    "chain reading its receiver": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = x.clone()
        d.mul_(2).add_(d)
        return g * w * d, g * 2 * x * x
    return 2 * x * x * w, backward
""",
    # `e` is `gx`'s tensor, through the value the in-place call returns.
    "alias returned by the write": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        gx = g * w
        e = gx.mul_(2)
        gx.mul_(2)
        return e, 4 * g * x
    return 4 * x * w, backward
""",
    "alias bound by a walrus": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        e = (gx := g * w)
        gx.mul_(2)
        return e, 2 * g * x
    return 2 * x * w, backward
""",
    # Under no_grad the closure changes the values and keeps `d`'s graph (2 * x).
    "no_grad block": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = 2 * x
        with torch.no_grad():
            d.clamp_(min=-100.0)
        return g * w * d, g * x * x
    return x * x * w, backward
""",
    "copy into a buffer": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        gx = torch.empty_like(x)
        gx.copy_(g * w * (1 - t * t))
        return gx, g * t
    return t * w, backward
""",
    "inplace flag": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = torch.exp(x)
        F.relu(d, inplace=True)
        return g * w * d, g * d
    return torch.exp(x) * w, backward
""",
    # `gx` was the incoming gradient, and is a new tensor by the write.
    "rebound from the incoming gradient": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        gx = g
        gx = gx * w
        gx.mul_(2)
        return gx, 2 * g * x
    return 2 * x * w, backward
""",
    # `gx[i]` is a view of `gx`: the op changes `gx`.
    "op on a part": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sin(x)
    def backward(g):
        gx = torch.zeros_like(x)
        for i in range(x.shape[0]):
            gx[i].add_(g[i] * w * torch.cos(x[i]))
        gx[0, :2].copy_(g[0, :2] * w[:2] * torch.cos(x[0, :2]))
        return gx, g * t
    return t * w, backward
""",
    # A reverse cumulative sum: `gx[i] = acc` copies `acc`, which stays backward's.
    "running sum stored by rows": """
def f(x: torch.Tensor, w: torch.Tensor):
    y = torch.cumsum(x, 0) * w
    def backward(g):
        gx = torch.zeros_like(x)
        acc = torch.zeros_like(w)
        for i in range(x.shape[0] - 1, -1, -1):
            acc += g[i] * w
            gx[i] = acc
        return gx, g * torch.cumsum(x, 0)
    return y, backward
""",
    "running sum copied by rows": """
def f(x: torch.Tensor, w: torch.Tensor):
    y = torch.cumsum(x, 0) * w
    def backward(g):
        gx = torch.zeros_like(x)
        acc = torch.zeros_like(w)
        for i in range(x.shape[0] - 1, -1, -1):
            acc.add_(g[i] * w)
            gx[i].copy_(acc)
        return gx, g * torch.cumsum(x, 0)
    return y, backward
""",
    # Backward's `s` is its own, though forward binds an `s` too.
    "named like a forward local": """
def f(x: torch.Tensor, w: torch.Tensor):
    s = torch.tanh(x)
    def backward(g):
        s = torch.tanh(x)
        s.pow_(2).neg_().add_(1)
        return g * w * s, g * torch.tanh(x)
    return s * w, backward
""",
    # In-place chains on new tensors that no name holds: exp and tanh saved them.
    "chain on a new tensor, returned": """
def f(x: torch.Tensor, w: torch.Tensor):
    e = torch.exp(x)
    def backward(g):
        return torch.exp(x).mul_(g * w), (g * torch.exp(x)).mul_(1.0)
    return e * w, backward
""",
    "chain on a new tensor, assigned": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        d = torch.tanh(x).pow_(2).neg_().add_(1)
        return g * w * d, g * t
    return t * w, backward
""",
    # The chain reads the name it is bound to: the old `d`, not the new tensor.
    "chain on a new tensor, reading its target": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sigmoid(x)
    def backward(g):
        d = g * w
        d = torch.sigmoid(x).mul_(1 - torch.sigmoid(x)).mul_(d)
        return d, g * t
    return t * w, backward
""",
    # Chains inside the returned expressions, each on its own new tensor.
    "chains on new tensors inside an expression": """
def f(x: torch.Tensor, w: torch.Tensor):
    e = torch.exp(x)
    def backward(g):
        one = torch.ones_like(x)
        return g * w * torch.exp(x).mul_(1.0), (g * torch.exp(x).mul_(one)).sum(0)
    return e * w, backward
""",
    # The chain is the operand of a write of a name, which runs after it.
    "chain on a new tensor in an operand of a write": """
def f(x: torch.Tensor, w: torch.Tensor):
    e = torch.exp(x)
    def backward(g):
        gx = g * w
        gx.mul_(x.exp().add_(0.0))
        gw = g * 1.0
        gw *= torch.exp(x).mul_(1.0)
        return gx, gw
    return e * w, backward
""",
    # `gx` is the incoming gradient on the other branch: the chain gets a name of
    # its own, and `gx` is bound to it (an outside probe found it refused).
    "chain on a new tensor bound where a branch binds the gradient": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        if x.numel() < 0:
            gx = g
        else:
            gx = torch.exp(x).mul_(g).mul_(w)
        return gx, g * torch.exp(x)
    return torch.exp(x) * w, backward
""",
    # Builtins beside the chain change nothing (an outside probe found it kept).
    "chain on a new tensor beside builtins": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        return torch.exp(x).mul_(g * w) * len(x) / max(3, 1), (
            g * torch.exp(x) * len(x) / 3
        ).sum(0)
    return torch.exp(x) * w * len(x) / 3, backward
""",
    # A chain in an operand of a chain: named once the outer one is out of place.
    "chains on new tensors nested": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        gx = torch.ones_like(x).sub_(torch.tanh(x).pow_(2)).mul_(g * w)
        gx *= torch.sigmoid(x).mul_(torch.sigmoid(x).neg_().add_(1)).mul_(0.0).sub_(-1)
        return gx, g * t
    return t * w, backward
""",
    "chain on a new tensor in a branch": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sigmoid(x)
    def backward(g):
        if x.dim() > 1:
            gx = (g * w).mul_(torch.sigmoid(x)).mul_(1 - t)
        else:
            gx = g * w * t * (1 - t)
        return gx, g * t
    return t * w, backward
""",
    # A sum that starts from the number 0 has no dtype to keep at its first `+=`.
    "accumulated from zero": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.exp(x)
    def backward(g):
        gw = 0
        for i in range(x.shape[0]):
            gw += g[i] * t[i]
        return g * w * t, gw
    return t * w, backward
""",
}

NEEDS = [None, [True, False], [False, True]]


@pytest.mark.parametrize("needs", NEEDS, ids=["all", "x", "w"])
@pytest.mark.parametrize("case", list(CASES))
def test_backward_inplace_write_is_right_at_every_order(tmp_path, case, needs):
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + CASES[case], "bip")
    _check(closures, generated, "f", [_r(3, 4), _r(4, seed=1)], needs)


@pytest.mark.parametrize("case", list(CASES))
def test_backward_inplace_write_under_torch_func(tmp_path, case):
    """jacrev, jacfwd and hessian (vmap of backward, forward over reverse) agree with
    the closure's forward."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + CASES[case], "bipf")
    x, w = _r(3, 4), _r(4, seed=1)

    def loss(module, a, b):
        out = module.f(a, b)
        return (out[0] if module is closures else out).sin().sum()

    for transform in (torch.func.jacrev, torch.func.jacfwd, torch.func.hessian):
        for argnums in (0, 1):
            got = transform(lambda a, b: loss(generated, a, b), argnums)(x, w)
            want = transform(lambda a, b: loss(closures, a, b), argnums)(x, w)
            torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
    # Per-sample weights: vmap of grad, the weight batched and x not.
    weights = torch.stack([_r(4, seed=s) for s in range(3)])
    for argnums in (0, 1):
        grads = [
            torch.func.vmap(
                torch.func.grad(lambda a, b, m=module: loss(m, a, b), argnums),
                in_dims=(None, 0),
            )(x, weights)
            for module in (generated, closures)
        ]
        torch.testing.assert_close(*grads, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("case", list(CASES))
def test_backward_inplace_write_under_batched_gradients(tmp_path, case):
    """`autograd.grad(..., is_grads_batched=True)` and `jacobian(vectorize=True)`
    batch the incoming gradients with torch's older vmap, which `_setitem` did not
    see: a store of a batched value into `torch.zeros_like(x)` raised there (and in
    gradgradcheck's batched check). Both agree with the closure's forward now."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + CASES[case], "bipb")
    x, w = _r(3, 4), _r(4, seed=1)
    basis = torch.eye(12, dtype=torch.float64).reshape(12, 3, 4)
    found = []
    for module in (generated, closures):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = module.f(a, b)
        out = out[0] if module is closures else out
        found.append(torch.autograd.grad(out, (a, b), basis, is_grads_batched=True))
        found.append(
            torch.autograd.functional.jacobian(
                lambda p, q, m=module: m.f(p, q)[0] if m is closures else m.f(p, q),
                (x, w),
                vectorize=True,
            )
        )
    for got, want in zip(found[:2], found[2:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def test_backward_inplace_writes_read_as_bindings():
    """The generated backward binds each changed tensor anew, from the source's
    operands; the dtype the in-place op kept is kept where an operand is a tensor."""
    from s2sgrad import transform

    text = transform(HEAD + CASES["method"], "m.py", "m")
    assert "d = d.mul(1 - d).to(d.dtype)" in text
    assert "mul_" not in text
    text = transform(HEAD + CASES["chain"], "m.py", "m")
    assert "d = d.pow(2).neg().add(1)" in text
    text = transform(HEAD + CASES["function"], "m.py", "m")
    assert "s = torch.sigmoid(s)" in text
    text = transform(HEAD + CASES["augmented"], "m.py", "m")
    assert "d = (d * w).to(d.dtype)" in text
    text = transform(HEAD + CASES["store"], "m.py", "m")
    assert "gx = _setitem(gx, m, d[m])" in text
    text = transform(HEAD + CASES["augmented store in a loop"], "m.py", "m")
    assert "gx = _setitem(gx, i, gx[i] + (g[i] * w * torch.cos(x[i])))" in text
    assert "# the closure `backward`, its in-place ops out of place" in text
    text = transform(HEAD + CASES["chain on a new tensor, returned"], "m.py", "m")
    assert "exp = torch.exp(x)\n" in text
    assert "exp = exp.mul(g * w).to(exp.dtype)\n" in text
    assert "product = g * torch.exp(x)\n" in text
    assert "product = product.mul(1.0)\n" in text  # a number: nothing to promote
    assert "return exp, product" in text and "mul_" not in text
    text = transform(HEAD + CASES["chain on a new tensor, assigned"], "m.py", "m")
    assert "d = torch.tanh(x)\n" in text
    assert "d = d.pow(2).neg().add(1)\n" in text
    text = transform(
        HEAD + CASES["chain on a new tensor, reading its target"], "m.py", "m"
    )
    assert "sigmoid = torch.sigmoid(x)\n" in text and "d = sigmoid\n" in text


NOT_NAMED = {
    # Only one branch runs the chain: naming it first would run it always.
    "in a conditional expression": "return g * w * torch.exp(x).mul_(2.0) "
    "if len(x) > 1 else g, (g * x).sum(0)",
    # `keep` may change what the chain reads: the order must stay.
    "beside a call of a function": "return keep(g) * torch.exp(x).mul_(2.0), g",
    # `len` is the user's here, and may change anything.
    "beside a builtin's name rebound": "len = keep\n        "
    "return torch.exp(x).mul_(2.0) * len(g), g",
    # `add_` changes `d` before the operand is read: the order must stay.
    "in an operand of a chain of writes": "d = g * w\n        "
    "d.mul_(2.0).add_(torch.exp(d).mul_(2.0))\n        return d, g",
    "in a lambda": "return (lambda: torch.exp(x).mul_(g))(), g",
    "in a comprehension": "return sum([torch.exp(x).mul_(g) for _ in range(1)]), g",
    # A chain on a name's tensor is judged as a write of that name.
    "on an item": "d = [g * w]\n        return d[0].mul_(2.0), g",
}


@pytest.mark.parametrize("statement", list(NOT_NAMED.values()), ids=list(NOT_NAMED))
def test_a_chain_that_may_not_run_first_is_not_named(statement):
    """A chain is bound to a name only where it runs whenever the statement does,
    and nothing else in the statement may change what it reads."""
    from s2sgrad import transform

    source = (
        HEAD
        + "def keep(v):\n    return v\n\n\n"
        + "def f(x: torch.Tensor, w: torch.Tensor):\n"
        + "    def backward(g):\n"
        + f"        {statement}\n"
        + "    return torch.exp(x) * w, backward\n"
    )
    text = transform(source, "m.py", "m")
    body = text[text.index("def f_backward") : text.index("class FFunction")]
    assert " = torch.exp(" not in body  # no chain was named
    kept = "d[0].mul_(2.0)" if "d[0]" in statement else ").mul_("
    assert kept in body


def test_a_chain_on_a_new_tensor_keeps_its_dtype(tmp_path):
    """`torch.exp(x).mul_(g)` keeps exp's dtype where `g` would promote it: the
    generated backward hands back what the closure's does."""
    from oracle import import_pair

    closures, generated = import_pair(
        tmp_path, HEAD + CASES["chain on a new tensor, returned"], "bipd"
    )
    x, w = torch.randn(3, 4), torch.randn(4)
    g = torch.randn(3, 4, dtype=torch.float64)
    _, backward = closures.f(x, w)
    _, ctx = generated.f_forward(x, w)
    expected = backward(g)
    found = generated.f_backward(ctx, g)
    assert [t.dtype for t in found] == [t.dtype for t in expected]
    assert [t.dtype for t in expected] == [torch.float32, torch.float64]
    for a, b in zip(found, expected, strict=True):
        torch.testing.assert_close(a, b)


SHARED = """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = g * w
        e = d.view(-1)
        d.mul_(2)
        return e.view_as(x), (g * x).sum(0)
    return x * w, backward
"""


def test_a_write_another_name_sees_is_kept_as_written(tmp_path):
    """`e` views `d`'s memory and sees the change: written out of place, `e` would not.
    Such a write is kept, and the op's first order is the closure's."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + SHARED, "bips")
    assert "d.mul_(2)" in (tmp_path / "bips_grad.py").read_text()
    x, w = _r(3, 4).requires_grad_(), _r(4, seed=1).requires_grad_()
    g = _r(3, 4, seed=2)
    got = torch.autograd.grad(generated.f(x, w), (x, w), g)
    _, backward = closures.f(x, w)
    want = backward(g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


FORWARD_SUMS = {
    "loop": """
def f(x: torch.Tensor, w: torch.Tensor):
    total = 0
    for i in range(2):
        total += x * w * (i + 1)
    def backward(g):
        return g * w * 3, g * x * 3
    return total * 1.0, backward
""",
    "straight": """
def f(x: torch.Tensor, w: torch.Tensor):
    total = 0.0
    total += x * w
    total += x
    def backward(g):
        return g * (w + 1), g * x
    return total, backward
""",
}


@pytest.mark.parametrize("case", list(FORWARD_SUMS))
def test_forward_sum_from_a_number(tmp_path, case):
    """`total = 0` then `total += t` in forward: the binding the rewrite writes read
    `total.dtype` of the number 0, and every call failed."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + FORWARD_SUMS[case], "fsum")
    _check(closures, generated, "f", [_r(3, 4), _r(4, seed=1)])


def test_forward_sum_of_tensors_keeps_its_dtype():
    """Where every binding of the name is a tensor, the rewrite keeps the dtype the
    in-place op kept (a bfloat16 activation plus a float32 bias stays bfloat16)."""
    from s2sgrad import transform

    source = HEAD + FORWARD_SUMS["straight"].replace("total = 0.0", "total = x * 2")
    assert "total = (total + (x * w)).to(total.dtype)" in transform(source, "m.py", "m")


@pytest.mark.parametrize(
    "binding",
    [
        "d = g",
        "d = g.view(-1).view_as(g)",
        "d = g if g.dim() else g * 2",
        "d, e = g, g.clone()",
        "d, *rest = [g, g]",
        "d = None or g",
        "d, e = g.split([1, 2])",
        "for d in g.unbind(0):\n            pass",
    ],
)
def test_changing_an_incoming_gradient_through_another_name_is_refused(binding):
    """`d = g; d.mul_(2)` changes the caller's gradient as `g.mul_(2)` does (S2S103),
    and failed under jacfwd and hessian."""
    source = HEAD + f"""
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        {binding}
        d.mul_(2)
        return d * w, (g * x).sum(0)
    return 2 * x * w, backward
"""
    found = _refused(source)
    assert found.code == "S2S103" and found.line == 9 + binding.count("\n")
    assert "incoming gradient `g`" in found.message


MIXED = """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        gx = torch.zeros_like(x, dtype=torch.float32)
        m = x > 0
        gx[m] += (g * w)[m]
        return gx.to(g.dtype) + g * w * (x <= 0), (g * x).sum(0)
    return x * w, backward
"""


def test_an_augmented_store_keeps_the_buffers_dtype(tmp_path):
    """`gx[m] += v` keeps a float32 buffer float32 in place; written as
    `_setitem(gx, m, gx[m] + v)` the float64 sum reached `index_put`, which refused it
    (as under autocast, a bfloat16 buffer plus a float32 gradient)."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + MIXED, "bipm")
    x, w = _r(3, 4).requires_grad_(), _r(4, seed=1).requires_grad_()
    g = _r(3, 4, seed=2)
    got = torch.autograd.grad(generated.f(x, w), (x, w), g)
    want = closures.f(x, w)[1](g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


#: An object that keeps what it is given, by a tensor method's name or by `+`.
BOX = """
class Box:
    def copy_(self, v):
        self.v = v

    def __add__(self, v):
        self.v = v
        return self

"""

ESCAPES = {
    "or": "b = None or a",
    "and": "b = True and a",
    "default of a def": "def get(v=a):\n            return v\n        b = get()",
    "default of a lambda": "get = lambda v=a: v\n        b = get()",
    "map": "b = list(map(lambda v: v, [a]))[0]",
    "walrus statement": "(b := a)",
    "walrus in a binding": "b = (c := a)",
    "dunder": "b = a.__iadd__(0)",
    "list item": "box = [None]\n        box[0] = a\n        b = box[0]",
    "unary plus": "b = +a",
    "einsum": "b = torch.einsum('ij->ij', a)",
    "type": "b = a.type(torch.float64)",
    "dropout1d in eval": "b = F.dropout1d(a, 0.5, False)",
    "positional inplace flag": "b = F.hardtanh(a, -100.0, 100.0, True)",
    "input by keyword": "b = torch.reshape(input=a, shape=(3, 4))",
    "a later argument": "_, b = torch.broadcast_tensors(g, a)",
    "dict key": "dd = {}\n        dd[a] = 0\n        b = next(iter(dd))",
    "locals": "b = locals()['a']",
    "inplace flag by position": "b = F.hardtanh(a, -100.0, 100.0, 1)",
    "inplace flag by a name": (
        "ip = True\n        b = F.hardtanh(a, -100.0, 100.0, inplace=ip)"
    ),
    "shadowed builtin": "abs = lambda v: v\n        b = abs(a)",
    "object's method": "box = Box()\n        box.copy_(a)\n        b = box.v",
    "object's operator": "b = (Box() + a).v",
    "in a branch of a loop": (
        "b = a * 1\n        for i in range(2):\n            if i == 1:\n"
        "                b = a\n            a.mul_(1)"
    ),
}


@pytest.mark.parametrize("binding", list(ESCAPES.values()), ids=list(ESCAPES))
def test_a_tensor_handed_on_before_the_write_sees_it(tmp_path, binding):
    """`b` holds `a`'s tensor in ways no binding rule names (an outside probe found
    each): written out of place, `a.mul_(2)` left `b` at the old values, and the x
    gradient came out half the true one, at first order."""
    from oracle import import_pair

    source = HEAD + BOX + f"""
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        a = g * w * (1 - t * t)
        {binding}
        a.mul_(2)
        return b / 2, g * t
    return t * w, backward
"""
    closures, generated = import_pair(tmp_path, source, "bipe")
    _check(closures, generated, "f", [_r(3, 4), _r(4, seed=1)])


@pytest.mark.parametrize("binding", ["b = None or t", "b = True and t"])
def test_forward_write_another_name_holds_by_an_operator_is_refused(binding):
    """`b = None or t` makes `b` forward's `t` itself: `t.mul_(2)`
    written out of place left `b` as it was (the op's output wrong), silently."""
    source = HEAD + f"""
def f(x: torch.Tensor, w: torch.Tensor):
    t = x * w
    {binding}
    t.mul_(2)
    def backward(g):
        return g * w * 2, g * x * 2
    return b * 1.0, backward
"""
    found = _refused(source)
    assert found.code == "S2S123" and "`b` may share its memory" in found.message


def test_rewritten_backwards_pass_mypy_strict(tmp_path):
    """What the rewrite writes is typed as the rest of the module is. (A sum started
    from the number 0 is left out: its source binds one name to an int and to a
    tensor, which mypy refuses in the closure too.)"""
    from oracle import mypy_strict

    from s2sgrad import transform

    source = HEAD + "\n".join(
        case_source.replace("def f(", f"def f{i}(")
        for i, (case, case_source) in enumerate(CASES.items())
        if case != "accumulated from zero"
    )
    text = transform(source, "m.py", "m")
    assert text.count("its in-place ops out of place") >= 5
    assert mypy_strict(tmp_path, "m_grad.py", text) == ""


KEPT = {
    # `gx[flag]` by a bool is a copy: the closure's `add_` changes nothing.
    "bool index": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sin(x)
    def backward(g):
        gx = g * w * torch.cos(x)
        flag = True
        gx[flag].add_(1.0)
        return gx, g * t
    return t * w, backward
""",
    # `a` is a list where it is written, a tensor only at backward's end.
    "a list at the write": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.sin(x)
    def backward(g):
        a = [g * w * torch.cos(x)]
        a[0].mul_(2)
        b = a[0]
        a = g * 1
        return b / 2, g * t
    return t * w, backward
""",
    # Grad mode off by a flag, or by the statement form: the closure keeps `d`'s graph.
    "grad mode off by a flag": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = 2 * x
        flag = False
        with torch.set_grad_enabled(flag):
            d.clamp_(min=-100.0)
        return g * w * d, g * x * x
    return x * x * w, backward
""",
    "grad mode off by a statement": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = 2 * x
        torch.set_grad_enabled(False)
        d.clamp_(min=-100.0)
        torch.set_grad_enabled(True)
        return g * w * d, g * x * x
    return x * x * w, backward
""",
    # `add_` raises after `mul_` doubled `d`, which the handler then sees.
    "a chain that raises halfway": """
def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x)
    def backward(g):
        d = g * w * (1 - t * t)
        try:
            d.mul_(2).add_(torch.ones(5))
        except RuntimeError:
            pass
        return d / 2, g * t
    return t * w, backward
""",
}


@pytest.mark.parametrize("case", list(KEPT))
def test_writes_the_rewrite_cannot_prove_are_kept(tmp_path, case):
    """What a name holds where it is written (not at backward's end), grad mode
    however it is switched, a `try` that may see a write half done: kept as written,
    and right at every order."""
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + KEPT[case], "bipk")
    _check(closures, generated, "f", [_r(3, 4), _r(4, seed=1)])


FIRST_ORDER = {
    # `d.mul_(d[:, :1])` overwrites column 0 first and then reads it; its
    # out-of-place form reads the old column.
    "an operand viewing the written tensor": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        d = g * w
        d.mul_(d[:, 0:1])
        return d, (g * x).sum(0)
    return x * w, backward
""",
    # `out=a` returns `a` itself (autograd refuses `out=` past the first order).
    "out= argument": """
def f(x: torch.Tensor, w: torch.Tensor):
    def backward(g):
        a = g * w
        b = torch.add(a, 0, out=a)
        a.mul_(2)
        return b / 2, (g * x).sum(0)
    return x * w, backward
""",
}


@pytest.mark.parametrize("case", list(FIRST_ORDER))
def test_writes_an_operand_sees_give_the_closures_first_order(tmp_path, case):
    from oracle import import_pair

    closures, generated = import_pair(tmp_path, HEAD + FIRST_ORDER[case], "bipv")
    x, w = _r(3, 4).requires_grad_(), _r(4, seed=1).requires_grad_()
    g = _r(3, 4, seed=2)
    got = torch.autograd.grad(generated.f(x, w), (x, w), g)
    with torch.no_grad():
        want = closures.f(x, w)[1](g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
