"""Closures written by an outside tester against branches, outputs without a gradient
parameter and composition (issue 24), and what they found.

Each case either converts and matches torch.autograd through the closure's own forward
at orders 1 to 3, pure and mixed, in float64 (tests/oracle.py), or is refused with a
located, coded error. What they found: Python's `random` (and NumPy's) was not a random
draw to the recomputation checks, so a replay redrew it and even the first order was
silently wrong; a kept closure's argument changed in place after the call was read
changed by backward (first order wrong); a list parameter indexed in a promoted
temporary (`h = xs[0] * w`) crashed every call (`xs.device`); a differentiator whose
`if`/`else` each define backward and return was dropped without a word.
"""

from __future__ import annotations

import random

import pytest
import torch
from oracle import assert_same, derivatives, import_pair, leaves

from s2sgrad import opfacts, transform
from s2sgrad.diagnostics import TransformError

F64 = torch.float64


def _check(closures, generated, fn, values, rest=(), seed=None):
    def reseed():
        if seed is not None:
            torch.manual_seed(seed)
            random.seed(seed)

    def ref(*t):
        reseed()
        out = getattr(closures, fn)(*t, *rest)
        return out[:-1] if len(out) > 2 else out[0]

    def got(*t):
        reseed()
        return getattr(generated, fn)(*t, *rest)

    expected = derivatives(ref, leaves(values))
    assert_same(derivatives(got, leaves(values)), expected)


def _refused(source: str) -> tuple[str, int, int]:
    with pytest.raises(TransformError) as caught:
        transform(source, "m.py", "m")
    diagnostic, *_ = caught.value.diagnostics
    return diagnostic.code, diagnostic.line, diagnostic.column


# -- a kept closure's argument changed in place after the call -------------------------

INNER_EXP = """import torch


def inner_exp(x):
    e = torch.exp(x)
    def backward(g):
        return g * e
    return e * 2.0, backward

"""

ARG_CHANGED_AFTER_CALL = {
    "mul_": """
def f(x):
    h = x * 1.0
    y, back = inner_exp(h)
    h.mul_(3.0)
    def backward(g):
        return back(g) * 2.0
    return y, backward
""",
    "add_then_read": """
def f(x):
    h = x * 1.0
    y, back = inner_exp(h)
    h.add_(1.0)
    z = y * h
    def backward(g):
        return back(g * h) * 2.0 + g * y
    return z, backward
""",
    "item_store": """
def f(x):
    h = x * 1.0
    y, back = inner_exp(h)
    h[0] = 0.0
    z = y * h
    def backward(g):
        gh = g * y
        gh[0] = 0.0
        return back(g * h) * 2.0 + gh
    return z, backward
""",
}


@pytest.mark.parametrize("case", sorted(ARG_CHANGED_AFTER_CALL))
def test_an_argument_changed_in_place_after_the_call_is_refused_at_the_change(case):
    """Backward would recompute `inner_exp`'s context from `h` as changed: the
    argument is kept at the call (`back_h = h`), and the change, which would alter
    the kept tensor too, is S2S123 at its line."""
    assert _refused(INNER_EXP + ARG_CHANGED_AFTER_CALL[case]) == ("S2S123", 14, 5)


# -- Python's and NumPy's random numbers, replayed -------------------------------------

PYRANDOM = {
    "kept_closure": """import random
import torch


def inner(x, w):
    s = random.random()
    t = torch.tanh(x * w * s)
    def backward(g):
        d = g * (1 - t * t) * s
        return d * w, d * x
    return t, backward


def f(x, w):
    y, back = inner(x, w)
    def backward(g):
        return back(2 * g * y)
    return y * y, backward
""",
    "loop": """import random
import torch


def f(x, w):
    h = x * w
    for _ in range(3):
        if random.random() < 0.5:
            h = h * 2.0
        else:
            h = h * 3.0
    y = h * h
    def backward(g):
        gh = 2 * g * h * (h / (x * w))
        return gh * w, gh * x
    return y, backward
""",
    "helper": """import random
import torch


def _jitter(x):
    return x + random.gauss(0.0, 1.0)


def f(x):
    t = _jitter(x)
    e = torch.exp(t)
    def backward(g):
        return g * e
    return e * 1.0, backward
""",
}


@pytest.mark.parametrize(
    ("case", "where"),
    [("helper", (10, 9)), ("kept_closure", (15, 8)), ("loop", (8, 12))],
)
def test_python_random_in_what_backward_recomputes_is_refused(case, where):
    """A replay would draw another number (`random.random()`, `random.gauss` in a
    helper, a stochastic-depth loop): S2S121, as for `torch.rand`."""
    assert _refused(PYRANDOM[case]) == ("S2S121", *where)


NUMPY_RANDOM = """import numpy as np
import torch


def f(x):
    h = x
    for _ in range(2):
        h = h * float(np.random.uniform(1.0, 2.0))
    e = torch.exp(h)
    def backward(g):
        return g * e * (e.log() / x)
    return e * 1.0, backward
"""


def test_numpy_random_in_a_replay_is_refused():
    assert _refused(NUMPY_RANDOM)[0] == "S2S121"


def test_python_random_in_a_branch_test_is_forwards_answer(tmp_path):
    """Outside a replay, a test that draws is kept from forward (`cond = ...`)."""
    source = """import random
import torch


def f(x, w):
    h = x * w
    if random.random() < 0.5:
        h = h * 3.0
    y = h * h
    def backward(g):
        gh = 2 * g * h * (h / (x * w))  # times 3 where the branch ran
        return gh * w, gh * x
    return y, backward
"""
    closures, generated = import_pair(tmp_path, source, "pyrandom_branch")
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, dtype=F64, generator=gen) for s in ((2, 3), (3,))]
    for seed in range(4):
        _check(closures, generated, "f", values, seed=seed)


# -- a list parameter indexed in a promoted temporary ----------------------------------

LIST_INDEXED = """import torch
from typing import List


def f(xs: List[torch.Tensor], w):
    if len(xs) > 1:
        h = torch.stack(xs, 0).sum(0) * w
    else:
        h = xs[0] * w
    t = torch.tanh(h)
    def backward(g):
        gh = g * (1 - t * t)
        return [gh * w for _ in xs], gh * h / w
    return t, backward
"""


@pytest.mark.parametrize("n", [1, 2])
def test_a_list_parameter_indexed_in_a_promoted_temporary(tmp_path, n):
    """`xs[0]` has no rule (it is an element of a list, not one tensor indexed): the
    temporary is recomputed, right at every order, instead of `xs.device` crashing."""
    closures, generated = import_pair(tmp_path, LIST_INDEXED, f"list_indexed_{n}")
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(2, 3, dtype=F64, generator=gen) for _ in range(n)]
    values.append(torch.rand(3, dtype=F64, generator=gen) + 0.5)

    def ref(*t):
        return closures.f(list(t[:-1]), t[-1])[0]

    def got(*t):
        return generated.f(list(t[:-1]), t[-1])

    assert_same(derivatives(got, leaves(values)), derivatives(ref, leaves(values)))


# -- backward defined in both branches, each returning ---------------------------------

BOTH_BRANCHES_RETURN = """

def f(x, sq: bool):
    if sq:
        def backward(g):
            return 2 * g * x, None
        return x * x, backward
    else:
        def backward(g):
            return g * torch.cos(x), None
        return torch.sin(x), backward
"""

ANOTHER = """

def g0(x):
    def backward(g):
        return 2 * g
    return 2 * x, backward
"""


def test_backward_in_both_branches_is_a_located_error():
    assert _refused("import torch\n" + BOTH_BRANCHES_RETURN) == ("S2S116", 6, 9)


def test_backward_in_both_branches_is_not_dropped_beside_another():
    assert _refused("import torch\n" + ANOTHER + BOTH_BRANCHES_RETURN)[0] == "S2S116"


# -- neighbours that passed, kept -----------------------------------------------------

PASSING = {
    # branch on tensor data, one-branch temporary read under the same test
    "one_branch_tensor_test": (
        """import torch


def f(x, w):
    h = x * w
    if h.mean() > 0:
        s = torch.sigmoid(h)
        h = h * s
    def backward(g):
        if (x * w).mean() > 0:
            g = g * (s + (x * w) * s * (1 - s))
        return g * w, g * x
    return h * 1.0, backward
""",
        [(2, 3), (3,)],
    ),
    # integer output first, promoted temporary, broadcast w
    "index_first_promoted": (
        """import torch


def f(x, w):
    h = torch.exp(x * w)
    v, i = torch.topk(h, 2, -1)
    def backward(gv):
        gh = torch.zeros_like(h).scatter(-1, i, gv) * h
        return gh * w, gh * x
    return i, v, backward
""",
        [(2, 4), (4,)],
    ),
}


@pytest.mark.parametrize("case", sorted(PASSING))
def test_neighbours(tmp_path, case):
    source, shapes = PASSING[case]
    closures, generated = import_pair(tmp_path, source, f"neighbour_{case}")
    gen = torch.Generator().manual_seed(0)
    _check(
        closures,
        generated,
        "f",
        [torch.randn(s, dtype=F64, generator=gen) for s in shapes],
    )


# -- an output that is the constant None -----------------------------------------------

NONE_OUTPUT = """import torch


def flat(x):
    v, i = torch.topk(x, 2)
    def backward(gv):
        return torch.zeros_like(x).scatter(-1, i, gv)
    return v, None, backward


def nested(x):
    v = x * 2.0
    def backward(g_none, gv):
        return gv * 2.0
    return (None, v), backward
"""


def test_an_output_that_is_none_converts_and_is_right(tmp_path):
    """`return v, None, backward` was an internal error: the Function unpacked its
    outputs into a variable named `None` (`v, None = output`)."""
    closures, generated = import_pair(tmp_path, NONE_OUTPUT, "none_output")
    x = torch.randn(2, 4, dtype=F64)
    v, nothing = generated.flat(x)
    assert nothing is None
    assert generated.nested(x)[0] is None

    def pick(out):
        return out[0] if out[0] is not None else out[1]

    for name in ("flat", "nested"):
        expected = derivatives(
            lambda t, name=name: pick(getattr(closures, name)(t)[:-1]), leaves([x])
        )
        got = derivatives(
            lambda t, name=name: pick(getattr(generated, name)(t)), leaves([x])
        )
        assert_same(got, expected)


# -- a module-level factory that returns a nested function -------------------------

FACTORY = """import torch


def make_act(alpha: float):
    \"\"\"A factory: returns its nested function alone, so it is no differentiator.\"\"\"
    def act(v):
        return torch.where(v > 0, v, alpha * v)
    return act


leaky = make_act(0.25)


def gated(x: torch.Tensor, w: torch.Tensor):
    h = leaky(x) * w
    def backward(grad):
        gx = grad * w * w * torch.where(x > 0, 1.0, 0.25)
        return gx, 2.0 * grad * h
    return h * w, backward
"""


def test_a_factory_beside_differentiators_is_a_plain_helper(tmp_path):
    """A function ending `return act` (a nested def, alone) is a factory, not a
    differentiator that lost its result: the module converts, and the op built on
    the factory's function is right at orders 1-3 with `w` broadcast."""
    closures, generated = import_pair(tmp_path, FACTORY, "factory_ops")
    assert not hasattr(generated, "make_act_forward")
    values = torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)
    _check(closures, generated, "gated", values)


# -- generated names that two differentiators, or a parameter, would share ---------

RULE = """def NAME(x, PARAM):
    y = x * PARAM
    def backward(grad):
        return grad * PARAM, grad * x
    return y, backward
"""


@pytest.mark.parametrize(
    "first,second",
    [
        ("gelu", "gelu_"),
        ("foo_bar", "fooBar"),
        ("gelu", "gelu_forward"),
        ("gelu", "GeluFunction"),
    ],
)
def test_two_differentiators_whose_generated_names_meet_are_refused(first, second):
    """`gelu` and `gelu_` both make `GeluFunction`: the second class replaced the
    first, and the op `gelu` silently computed `gelu_` (or crashed at call time)."""
    source = "import torch\n\n\n" + "\n\n".join(
        RULE.replace("NAME", name).replace("PARAM", "w") for name in (first, second)
    )
    code, line, _ = _refused(source)
    assert (code, line) == ("S2S114", 11)


def test_a_parameter_named_like_a_generated_definition_is_refused():
    source = "import torch\n\n\n" + RULE.replace("NAME", "gate").replace(
        "PARAM", "GateFunction"
    )
    code, line, column = _refused(source)
    assert (code, line, column) == ("S2S114", 4, 13)


# -- an augmented assignment on a parameter ------------------------------------------

AUGMENTED = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    BEFORE
    x OP 1.0
    t = torch.tanh(x * w)
    def backward(g):
        d = g * (1 - t * t)
        return d * w, d * x
    return t, backward
"""


@pytest.mark.parametrize("op", ["+=", "-=", "/="])
def test_an_augmented_assignment_on_a_tensor_parameter_is_refused(op):
    """`x += 1.0` on a tensor changes the caller's tensor, as `x.add_(1.0)` does
    (S2S103): it was kept in place, and every call moved the parameter."""
    source = AUGMENTED.replace("    BEFORE\n", "").replace("OP", op)
    assert _refused(source) == ("S2S103", 5, 5)


def test_an_augmented_assignment_after_rebinding_the_parameter(tmp_path):
    """After `x = x * 2.0`, `x` names a tensor forward made: `x += 1.0` is read as
    `x = x + 1.0` (broadcast w, orders 1-3 pure and mixed)."""
    source = AUGMENTED.replace("BEFORE", "x = x * 2.0").replace("OP", "+=")
    source = source.replace("return d * w, d * x", "return 2.0 * d * w, d * x")
    closures, generated = import_pair(tmp_path, source, "rebound")
    _check(
        closures,
        generated,
        "f",
        [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)],
    )


def test_an_augmented_assignment_on_a_number_parameter_converts(tmp_path):
    source = """import torch


def f(x: torch.Tensor, scale: float):
    scale += 1.0
    def backward(g):
        return g * scale, None
    return x * scale, backward
"""
    closures, generated = import_pair(tmp_path, source, "numbered")
    _check(closures, generated, "f", [torch.randn(3, 4, dtype=F64)], rest=(0.5,))


# -- an in-place op written out of place keeps the changed tensor's dtype ------------

KEEPS_DTYPE = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    y = x.clone()
    WRITE
    t = torch.tanh(y)
    def backward(g):
        d = g * (1 - t * t)
        return d * w, d * x
    return t, backward
"""


@pytest.mark.parametrize("write", ["y.mul_(w)", "y *= w"])
def test_an_in_place_op_written_out_of_place_keeps_the_dtype(tmp_path, write):
    """A bfloat16 `y` changed in place by a float32 `w` stays bfloat16 (mixed
    precision): written `y = y * w` it became float32, and the op's output and
    gradients differed from the closure's. Then orders 1-3 in float64."""
    source = KEEPS_DTYPE.replace("WRITE", write)
    closures, generated = import_pair(tmp_path, source, "keeps_dtype")
    assert ".to(y.dtype)" in (tmp_path / "keeps_dtype_grad.py").read_text()
    x = torch.randn(3, 4).bfloat16()
    w = torch.randn(4)
    found = []
    for fn in (lambda *t: closures.f(*t)[0], generated.f):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        out = fn(a * 1, b)
        out.float().sum().backward()
        found.append((out, a.grad, b.grad))
    for got, expected in zip(found[1], found[0], strict=True):
        assert got.dtype == expected.dtype
    torch.testing.assert_close(found[1][0], found[0][0], rtol=0, atol=0)
    for got, expected in zip(found[1][1:], found[0][1:], strict=True):
        # The closure's backward against autograd's, each rounding in bfloat16.
        torch.testing.assert_close(got.float(), expected.float(), rtol=5e-2, atol=5e-2)
    values = [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)]
    _check(closures, generated, "f", values)


# -- a module helper that changes the tensor it is given ------------------------------

HELPER_WRITES = """import torch


def _bump(t):
    t.mul_(2.0)


def _bump_twice(s, k=2):
    for _ in range(k):
        _bump(s)


def _fill(buffer, where):
    buffer[where] = 1.0


def f(x: torch.Tensor, w: torch.Tensor):
    u = x * w
    CALL
    def backward(g):
        return g * 2.0 * u * w, g * 2.0 * u * x
    return u * u, backward
"""


@pytest.mark.parametrize(
    ("call", "column"),
    [("_bump(u)", 11), ("_bump_twice(u)", 17), ("_bump_twice(k=1, s=u)", 22)],
)
def test_a_helper_that_changes_a_temporary_in_place_is_refused(call, column):
    """The closure runs `_bump(u)`, which doubles `u`; the op ran it too, but the
    promoted temporary's gradient was that of `u = x * w`, and orders 2 and 3 were
    silently wrong (an outside probe's `_bump(x)` pattern). A helper's body is not
    rewritten, so the call is S2S123 at the argument, through a helper of a helper
    and by keyword too."""
    assert _refused(HELPER_WRITES.replace("CALL", call)) == ("S2S123", 19, column)


def test_a_helper_that_changes_an_input_in_place_is_refused():
    assert _refused(HELPER_WRITES.replace("CALL", "_bump(x)")) == ("S2S103", 19, 11)


def test_a_helper_that_changes_a_captured_value_in_backward_is_refused():
    source = HELPER_WRITES.replace("CALL", "pass").replace(
        "        return g * 2.0", "        _bump(u)\n        return g * 2.0"
    )
    assert _refused(source) == ("S2S103", 21, 15)


def test_a_helper_that_fills_a_buffer_without_a_gradient_converts(tmp_path):
    """A helper that writes into a tensor forward made without a gradient (a mask)
    changes nothing autograd tracks: the op runs it as written and is right."""
    source = HELPER_WRITES.replace(
        "    u = x * w\n    CALL\n",
        "    mask = torch.zeros_like(x)\n    _fill(mask, x > 0)\n    u = x * w * mask\n",
    ).replace(
        "g * 2.0 * u * w, g * 2.0 * u * x", "g * 2 * u * w * mask, g * 2 * u * x * mask"
    )
    closures, generated = import_pair(tmp_path, source, "helper_fills")
    values = [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)]
    _check(closures, generated, "f", values)


HANDS_BACK = """import torch


HELPER


def f(x: torch.Tensor, w: torch.Tensor):
    h = x * w
    hs = _h(h)
    h += 1.0
    def backward(g):
        return g * w, g * x
    return hs[0] * 1.0, backward
"""

HANDING_HELPERS = {
    "a list": "def _h(t):\n    return [t]",
    "a list filled": "def _h(t):\n    out = []\n    out.append(t)\n    return out",
    "a tuple": "def _h(t, k=2):\n    return (t, k)",
    "through a helper": "def _w(t):\n    return [t]\n\n\ndef _h(t):\n    return _w(t)",
    "a view": "def _h(t):\n    return t.view(1, *t.shape)",
    "a loop that may not run": (
        "def _h(t, n=2):\n    out = t\n    for _ in range(n):\n"
        "        out = out * 2.0\n    return [out]"
    ),
    "one branch": (
        "def _h(t, k=1):\n    out = t * 2.0\n    if k > 1:\n        out = t\n"
        "    return [out]"
    ),
}


@pytest.mark.parametrize("case", sorted(HANDING_HELPERS))
def test_a_helper_that_hands_back_its_argument_shares_it(case):
    """`hs = _h(h); h += 1.0`: the closure's `h += 1.0` adds in place, so `hs[0]`
    (the same tensor) changes too. Calls of module helpers were read as making new
    values, `h += 1.0` was written `h = h + 1.0`, and the op returned the old value
    (a wrong output). Helper bodies are now read for what they may hand back: the
    write is S2S123 where its line is."""
    source = HANDS_BACK.replace("HELPER", HANDING_HELPERS[case])
    code, line, _ = _refused(source)
    assert (code, line) == (
        "S2S123",
        source[: source.index("h += 1.0")].count("\n") + 1,
    )


def test_a_helper_that_returns_a_new_value_does_not_share(tmp_path):
    """`_h` builds a new tensor: `h += 1.0` is read as `h = h + 1.0`, as in the
    random program softsign case, and the op matches autograd at orders 1-3."""
    source = HANDS_BACK.replace("HELPER", "def _h(t):\n    return [t * 2.0]").replace(
        "return g * w, g * x", "return g * 2.0 * w, g * 2.0 * x"
    )
    closures, generated = import_pair(tmp_path, source, "hands_new")
    values = [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)]
    _check(closures, generated, "f", values)


BACKWARD_ALIAS = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    u = x * w
    def backward(g):
        WRITE
        return g * 2 * u * w, g * 2 * u * x
    return u * u, backward
"""


@pytest.mark.parametrize(
    "write",
    [
        "a = u.view(-1)\n        a.mul_(1.0)",
        "a = u\n        b = a\n        b[0] = 0.0",
        "parts = [u]\n        parts[0].zero_()",
    ],
)
def test_backward_changing_a_captured_value_through_another_name_is_refused(write):
    """`a = u.view(-1); a.mul_(1.0)` in backward changed the saved `u`: the op
    converted and its second backward (a double backward, or `retain_graph`) raised
    torch's version-counter RuntimeError at call time. It is S2S103 at the write."""
    source = BACKWARD_ALIAS.replace("WRITE", write)
    code, line, _ = _refused(source)
    assert code == "S2S103"
    assert line == 7 + write.count("\n")


def test_backward_changing_its_own_copy_converts(tmp_path):
    """A copy backward makes (`c = g.clone()`, `a = u * 1.0`) is its own to change."""
    source = BACKWARD_ALIAS.replace(
        "WRITE",
        "a = u * 1.0\n        a.mul_(2.0)\n        c = g.clone()\n        c.mul_(1.0)",
    ).replace("g * 2 * u * w, g * 2 * u * x", "c * a * w, c * a * x")
    closures, generated = import_pair(tmp_path, source, "backward_copy")
    values = [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)]
    _check(closures, generated, "f", values)


# -- an Optional parameter rebound where it is None (probe A) -------------------------

OPTIONAL_REBOUND = {
    "ones": """import torch
from typing import Optional


def f(x: torch.Tensor, weight: Optional[torch.Tensor] = None):
    if weight is None:
        weight = torch.ones_like(x)
    y = weight * x * x
    def backward(g):
        return 2 * g * weight * x, g * x * x
    return y, backward
""",
    "gate": """import torch
from typing import Optional


def f(x: torch.Tensor, weight: Optional[torch.Tensor] = None):
    gated = weight is None
    if weight is None:
        weight = torch.sigmoid(x)
    y = weight * x
    def backward(g):
        through = g * x * weight * (1 - weight) if gated else 0.0
        return g * weight + through, g * x
    return y, backward
""",
    "bias_given": """import torch
from typing import Optional


def f(x: torch.Tensor, weight: Optional[torch.Tensor] = None):
    if weight is not None:
        weight = torch.tanh(weight)
    else:
        weight = x.new_ones(())
    y = weight * x * x
    def backward(g):
        return 2 * g * weight * x, g * x * x * (1 - weight * weight)
    return y, backward
""",
}


@pytest.mark.parametrize("case", sorted(OPTIONAL_REBOUND))
@pytest.mark.parametrize("given", [False, True])
def test_an_optional_parameter_rebound_where_it_is_none(tmp_path, case, given):
    """`if weight is None: weight = torch.ones_like(x)`, the usual weighted-loss
    idiom: the VJP reads the parameter as it came, kept as `weight_0` and returned
    as a view, which crashed every call where it was None ('NoneType' object has no
    attribute 'view_as'). Given (a broadcast (4,) weight whose gradient backward
    returns unreduced) or left None, the op matches at orders 1-3."""
    closures, generated = import_pair(
        tmp_path, OPTIONAL_REBOUND[case], f"optional_{case}_{given}"
    )
    x = torch.randn(3, 4, dtype=F64)
    if given:
        _check(closures, generated, "f", [x, torch.randn(4, dtype=F64)])
    else:
        _check(closures, generated, "f", [x])
        with torch.no_grad():
            torch.testing.assert_close(generated.f(x), closures.f(x)[0])


DEAD_IN_BRANCH = """import torch


def f(x: torch.Tensor, bias=None, act: str = "tanh"):
    h = x if bias is None else x + bias
    if act == "tanh":
        t = torch.tanh(h)
        slope = 1 - t * t
    else:
        t = torch.relu(h)
        slope = (h > 0).to(h.dtype)
    def backward(g):
        d = g * slope
        return d, (d if bias is not None else None), None
    return t, backward
"""


@pytest.mark.parametrize("act", ["tanh", "relu"])
def test_a_recomputed_value_is_not_left_dead_in_a_branch(tmp_path, act):
    """`slope` is recomputed in backward; forward kept its assignment inside the
    branches, dead work that ruff reports (F841). Forward drops it there too, and the
    op still matches at orders 1-3 (with and without the bias)."""
    import subprocess
    import sys

    closures, generated = import_pair(tmp_path, DEAD_IN_BRANCH, f"dead_{act}")
    text = (tmp_path / f"dead_{act}_grad.py").read_text()
    forward = text[text.index("def f_forward") : text.index("def f_recompute")]
    assert "slope" not in forward, forward
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "E4,E7,E9,F"]
        + [str(tmp_path / f"dead_{act}_grad.py")],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout
    x = torch.randn(3, 4, dtype=F64)
    _check(closures, generated, "f", [x], rest=(None, act))
    _check(closures, generated, "f", [x, torch.randn(4, dtype=F64)], rest=(act,))


OPTIONAL_BARE = """import torch
from typing import Optional


def f(x: torch.Tensor, b: Optional[torch.Tensor] = None):
    t = torch.tanh(2.0 * x if b is None else 2.0 * x + b)
    def backward(g):
        d = g * (1 - t * t)
        return 2.0 * d, d
    return t, backward
"""


def test_a_bare_gradient_for_an_optional_parameter_left_none(tmp_path):
    """`return 2.0 * d, d` with `b` left None: `d` was handed back ungated and
    autograd refused a gradient for an input that is not a tensor (every backward
    raised). It is gated by `needs` as the other spellings are."""
    closures, generated = import_pair(tmp_path, OPTIONAL_BARE, "optional_bare")
    x = torch.randn(3, 4, dtype=F64)
    _check(closures, generated, "f", [x])
    _check(closures, generated, "f", [x, torch.randn(4, dtype=F64)])


MODULE_STATE_BRANCH = """import torch

CFG = {"fast": True}


def f(x: torch.Tensor):
    fast = CFG["fast"]
    if CFG["fast"]:
        t = torch.tanh(x)
    else:
        t = torch.sigmoid(x)
    def backward(g):
        return 2.0 * g * (1 - t * t) if fast else 2.0 * g * t * (1 - t)
    return t * 2.0, backward
"""


def test_a_branch_on_module_state_keeps_forwards_answer(tmp_path):
    """`if CFG["fast"]:` was evaluated again by the generated VJP: a switch flipped
    between forward and the penalty's backward sent the second order down the other
    branch, silently. A test that reads a module-level object other than a number is
    forward's answer, kept as `cond`, as the closure's graph keeps it."""
    closures, generated = import_pair(tmp_path, MODULE_STATE_BRANCH, "module_state")
    x0 = torch.randn(5, dtype=F64)
    found = []
    for fn in (lambda a: closures.f(a)[0], generated.f):
        closures.CFG["fast"] = True
        (x,) = leaves([x0])
        (gx,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        closures.CFG["fast"] = False  # flipped before the penalty's backward
        try:
            (hx,) = torch.autograd.grad((gx * gx).sum(), x)
        finally:
            closures.CFG["fast"] = True
        found.append(hx)
    torch.testing.assert_close(found[1], found[0])
    _check(closures, generated, "f", [x0])


NUMBER_FOR_TENSOR = """import torch


def scale(x: torch.Tensor, temp: torch.Tensor):
    z = x / temp
    def backward(grad):
        return grad / temp, -(grad * z).sum() / temp
    return z * 1.0, backward
"""


def test_a_number_where_the_op_takes_a_tensor_is_one_clear_error(tmp_path):
    """Passing 0.7 for `temp: torch.Tensor` gave s2sgrad's TypeError in eager mode
    (saying the parameter had no annotation) and torch's internal AssertionError
    about save_for_forward under torch.func and autocast. Every mode now gives the
    same TypeError, which names the parameter and both ways out."""
    _, generated = import_pair(tmp_path, NUMBER_FOR_TENSOR, "number_for_tensor")
    x = torch.randn(3, 4, dtype=F64)

    def under_autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            generated.scale(x.float().requires_grad_(), 0.7)

    calls = {
        "eager": lambda: generated.scale(x.requires_grad_(), 0.7),
        "grad": lambda: torch.func.grad(lambda t: generated.scale(t, 0.7).sum())(x),
        "vmap": lambda: torch.func.vmap(lambda t: generated.scale(t, 0.7))(x),
        "jvp": lambda: torch.func.jvp(lambda t: generated.scale(t, 0.7), (x,), (x,)),
        "autocast": under_autocast,
    }
    for mode, call in calls.items():
        with pytest.raises(TypeError, match=r"takes `temp` as a tensor; got 0\.7") as e:
            call()
        assert "torch.tensor(0.7)" in str(e.value), mode


# -- in-place writes an outside probe found unseen (probe D) --------------------------

PROBE_D_REFUSED = {
    # A helper's `t *= 2.0` changes its tensor parameter in place.
    "helper augmented": (
        "def _h(t):\n    t *= 2.0\n",
        "    u = x * w\n    _h(u)\n",
        "S2S123",
    ),
    "helper augmented on an input": (
        "def _h(t):\n    t *= 2.0\n",
        "    u = x * w\n    _h(x)\n",
        "S2S103",
    ),
    # A helper writes through the list it is given.
    "through a list argument": (
        "def _h(ts):\n    for z in ts:\n        z.mul_(2.0)\n",
        "    u = x * w\n    _h([x])\n",
        "S2S103",
    ),
    "through an element": (
        "def _h(ts):\n    ts[0].mul_(2.0)\n",
        "    u = x * w\n    _h([u])\n",
        "S2S123",
    ),
    # A module-level lambda or an alias of a writing helper writes too.
    "module lambda": (
        "_h = lambda t: t.mul_(2.0)\n",
        "    u = x * w\n    _h(u)\n",
        "S2S123",
    ),
    "helper alias": (
        "def _bump(t):\n    t.mul_(2.0)\n\n\n_h = _bump\n",
        "    u = x * w\n    _h(u)\n",
        "S2S123",
    ),
    # ... and a lambda that hands its argument back shares it.
    "lambda handing back": (
        "_h = lambda z: z\n",
        "    u = x * w\n    v = _h(u)\n    v += 1.0\n",
        "S2S123",
    ),
    # Containers filled in ways the sharing check missed.
    "list concatenation": (
        "",
        "    u = x * w\n    hs = [] + [u]\n    u.mul_(2.0)\n",
        "S2S123",
    ),
    "dict update": (
        "",
        "    u = x * w\n    d = {}\n    d.update(a=u)\n    u.mul_(2.0)\n",
        "S2S123",
    ),
    # A view of an input bound to a name, then changed: the caller's tensor changes.
    "detached input": (
        "",
        "    z = x.detach()\n    z.mul_(2.0)\n    u = x * w\n",
        "S2S103",
    ),
}


@pytest.mark.parametrize("case", sorted(PROBE_D_REFUSED))
def test_in_place_writes_a_probe_found_unseen_are_refused(case):
    """Each converted and either changed the caller's tensor or gave wrong orders
    2-3 (or a wrong output): now refused, S2S103 on an input, S2S123 on a temporary."""
    helper, body, code = PROBE_D_REFUSED[case]
    source = (
        "import torch\n\n\n"
        + (helper + "\n\n" if helper else "")
        + "def f(x: torch.Tensor, w: torch.Tensor):\n"
        + body
        + "    def backward(g):\n        return g * w, g * x\n"
        + "    return u * 1.0, backward\n"
    )
    assert _refused(source)[0] == code


@pytest.mark.parametrize(
    "write",
    [
        "for a in [u]:\n            a.mul_(1.0)",
        "hs = [] + [u]\n        hs[0].mul_(1.0)",
        "hs = {}\n        hs.update(a=u)\n        hs['a'].mul_(1.0)",
    ],
)
def test_backward_changing_a_captured_value_held_elsewhere_is_refused(write):
    """The op converted and its double backward raised torch's version error."""
    assert _refused(BACKWARD_ALIAS.replace("WRITE", write))[0] == "S2S103"


NO_GRAD_WRITE = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = x * w
    with CONTEXT:
        WRITE
    def backward(g):
        return g * (t + x * w), g * x * x
    return t * x, backward
"""


@pytest.mark.parametrize(
    "context", ["torch.no_grad()", "torch.set_grad_enabled(False)"]
)
@pytest.mark.parametrize("write", ["t.mul_(2.0)", "t *= 2.0"])
@pytest.mark.parametrize("policy", ["promote", "recompute"])
def test_an_in_place_write_under_no_grad_keeps_the_graph(
    tmp_path, context, write, policy
):
    """Under `torch.no_grad()` the closure changes `t`'s values and keeps its graph
    (`t = x * w`); the op wrote `t = t.mul(2.0)` there, which cut `t` from x and w
    (orders 2-3 wrong). It now runs the write as written."""
    source = NO_GRAD_WRITE.replace("CONTEXT", context).replace("WRITE", write)
    name = f"no_grad_{policy}_{abs(hash((context, write))) % 10000}"
    closures, generated = import_pair(tmp_path, source, name, policy=policy)
    _check(
        closures,
        generated,
        "f",
        [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)],
    )


# -- composite ops that hand back a view of an operand, which no schema says ------------

COMPOSITE_SHARING = {
    # A view of the temporary, then the temporary changed: the view sees the change.
    "einsum of the base": ("b = torch.einsum('ij->ij', u)\n    u.mul_(2.0)", "S2S123"),
    "einsum written": ("b = torch.einsum('ij->ji', u)\n    b.mul_(2.0)", "S2S123"),
    "dropout1d in eval": ("b = F.dropout1d(u, 0.5, False)\n    u.mul_(2.0)", "S2S123"),
    "Tensor.type": ("b = u.type(torch.float64)\n    u.mul_(2.0)", "S2S123"),
    "asarray": ("b = torch.asarray(u)\n    u.mul_(2.0)", "S2S123"),
    # The shared operand is not the first argument.
    "broadcast, second": (
        "_, b = torch.broadcast_tensors(x, u)\n    u.mul_(2.0)",
        "S2S123",
    ),
    "meshgrid": ("b, = torch.meshgrid(u[0], indexing='ij')\n    u.mul_(2.0)", "S2S123"),
    # A write through such a view, with no name bound to it.
    "through einsum": ("b = u\n    torch.einsum('ij->ji', u).mul_(2.0)", "S2S123"),
    "through broadcast": (
        "b = u\n    torch.broadcast_tensors(u * 1.0, u)[1].mul_(2.0)",
        "S2S123",
    ),
    # ... and through callees spelled other than `torch.name` (these wrote `u` in
    # place unseen, so orders 2-3 used the changed `u` where autograd did not).
    "through F.dropout": (
        "b = u * 1.0\n    F.dropout(u, 0.5, False).mul_(2.0)",
        "S2S123",
    ),
    "through Tensor.narrow": (
        "b = u * 1.0\n    torch.Tensor.narrow(u, 0, 0, 2).mul_(2.0)",
        "S2S123",
    ),
    "through functional.einsum": (
        "b = u * 1.0\n    torch.functional.einsum('ij->ji', u).mul_(2.0)",
        "S2S123",
    ),
    "through einsum, an input": (
        "b = u\n    torch.einsum('ij->ji', x).mul_(2.0)",
        "S2S103",
    ),
}


@pytest.mark.parametrize("case", sorted(COMPOSITE_SHARING))
def test_writes_through_composite_views_are_refused(case):
    """`einsum`, `dropout1d` in eval mode, `Tensor.type`, `asarray`, `meshgrid` and
    `broadcast_tensors` may hand back a view of a tensor argument (not always the
    first) although their schemas say nothing of it. Each of these converted; where
    a name held the view, the write was rewritten out of place while the view kept
    the old values (a wrong output and wrong gradients at every order), and a write
    through an input's view changed the caller's tensor. Now refused, S2S123 on a
    temporary and S2S103 on an input, at the write."""
    body, code = COMPOSITE_SHARING[case]
    source = (
        "import torch\nimport torch.nn.functional as F\n\n\n"
        "def f(x: torch.Tensor, w: torch.Tensor):\n"
        "    u = x * w\n"
        f"    {body}\n"
        "    def backward(g):\n        return g * w, g * x\n"
        "    return u + b, backward\n"
    )
    assert _refused(source)[:2] == (code, 7 + body.count("\n"))


def test_composite_ops_that_share_are_in_the_table():
    """The build probes them: each shares its input's storage in the installed torch."""
    for name in ("torch.einsum", "torch.Tensor.type", "torch.nn.functional.dropout1d"):
        assert opfacts.may_share_memory(name), name
    assert opfacts.shares_any_argument("torch.broadcast_tensors")
    assert not opfacts.shares_any_argument("torch.narrow")
    assert not opfacts.may_share_memory("torch.matmul")


# -- an in-place op on a part: a view by ints, a copy by a bool -------------------------

BOOL_PARTS = {
    "a name bound to True": "k = True\n    u[k].mul_(2.0)",
    "a comparison": "k = x.shape[0] > 1\n    u[k].mul_(2.0)",
    "a bool parameter": "u[flag].mul_(2.0)",
    "not": "k = not x.shape[0]\n    u[0:k].mul_(2.0)",
}


@pytest.mark.parametrize("case", sorted(BOOL_PARTS))
def test_an_in_place_op_on_a_part_indexed_by_a_bool_is_refused(case):
    """`u[True]` is a copy of `u` (with a new leading dim), so the closure's
    `u[k].mul_(2.0)` with `k = True` changes nothing, where `u[1].mul_(2.0)` changes
    a row of `u`. Forward's value kinds call both numbers, and the first was written
    `u = _setitem(u, k, u[k].mul(2.0))`, which doubles all of `u`: a wrong output.
    Now an index name must be bound to ints only (`integers`), else S2S123."""
    body = BOOL_PARTS[case]
    source = (
        "import torch\n\n\n"
        "def f(x: torch.Tensor, w: torch.Tensor, flag: bool = True):\n"
        "    u = x * w\n"
        f"    {body}\n"
        "    def backward(g):\n        return g * w, g * x, None\n"
        "    return u, backward\n"
    )
    assert _refused(source)[:2] == ("S2S123", 6 + body.count("\n"))


INT_PARTS = {
    "a size": ("n = x.shape[0]\n    u[n - 1].mul_(2.0)", "m[n - 1] = 2.0"),
    "a counter": ("for i in range(2):\n        u[i].mul_(2.0)", "m[:2] = 2.0"),
    "augmented": ("k = 1\n    k += 1\n    u[k].mul_(2.0)", "m[k] = 2.0"),
    "an int parameter": ("u[-j:].mul_(2.0)", "m[-j:] = 2.0"),
    "len": ("u[len(x) // 2].mul_(2.0)", "m[len(x) // 2] = 2.0"),
}


@pytest.mark.parametrize("case", sorted(INT_PARTS))
def test_an_in_place_op_on_a_part_indexed_by_ints_is_written_out_of_place(
    case, tmp_path
):
    """Sizes, range counters, int parameters and their arithmetic are ints, so the
    part is a view and the write is rewritten (orders 1-3 as the closure's forward)."""
    body, mark = INT_PARTS[case]
    source = (
        "import torch\n\n\n"
        "def f(x: torch.Tensor, w: torch.Tensor, j: int = 1):\n"
        "    u = x * w\n"
        f"    {body}\n"
        "    def backward(g):\n"
        "        m = torch.ones_like(g)\n"
        f"        {mark}\n"
        "        return g * m * w, g * m * x, None\n"
        "    return u, backward\n"
    )
    closures, generated = import_pair(tmp_path, source, "int_parts")
    assert "_setitem(u, " in transform(source, "m.py", "m")
    x, w = torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)
    expected = derivatives(lambda a, b: closures.f(a, b)[0], leaves([x, w]))
    assert_same(derivatives(generated.f, leaves([x, w])), expected)


# -- more views an outside probe found unseen (probe E) ------------------------------

PROBE_E_VIEWS = {
    # A torch view function imported by its bare name, or given its tensor by keyword.
    "bare name": "from torch import narrow\n\n\ndef f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    d = narrow(t, 0, 0, 2)\n    d.mul_(2)\n",
    "keyword input": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    d = torch.reshape(input=t, shape=(12,))\n    d.mul_(2)\n",
    # A view made through a bound method or a subclass, then the base changed.
    "getattr": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    d = getattr(t, 'view')(3, 4)\n    t.mul_(2)\n",
    "getattr written": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    getattr(t, 'view')(12).mul_(2)\n",
    "as_subclass": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    d = t.as_subclass(torch.Tensor)\n    t.mul_(2)\n",
    # A library object that may keep what it is given.
    "namespace": "import types\n\n\ndef f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = x * 3.0\n    d = types.SimpleNamespace(v=t)\n    t.mul_(2)\n",
    # A fresh buffer filled with a differentiable value through a view: it carries a
    # gradient from then on (it was saved as a constant, and order 2 was wrong).
    "buffer select": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = torch.zeros(3, 4, dtype=x.dtype)\n    t.select(0, 1).copy_(x[1] * 3.0)\n",
    "buffer view": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = torch.zeros(3, 4, dtype=x.dtype)\n    t.view(-1).add_(x.reshape(-1))\n",
    "buffer rows": "def f(x: torch.Tensor, w: torch.Tensor):\n"
    "    t = torch.zeros(3, 4, dtype=x.dtype)\n    rows = [t[0], t[1]]\n"
    "    rows[1].add_(x[1] * 3.0)\n",
}


@pytest.mark.parametrize("case", sorted(PROBE_E_VIEWS))
def test_views_a_probe_found_unseen_are_refused(case):
    """Each converted and gave a wrong output or wrong gradients (orders 1-2): the
    write missed a view, or the view missed the write. Now S2S123 at the write."""
    source = (
        "import torch\n\n\n"
        + PROBE_E_VIEWS[case]
        + "    def backward(g):\n        return g * w, g * t\n"
        + "    return t * w, backward\n"
    )
    code, line, _ = _refused(source)
    assert code == "S2S123"
    assert line == source.count("\n") - 3


# -- copy_ into a buffer: a store -----------------------------------------------------

COPIES = {
    "whole": ("buf = torch.zeros(3, 4, dtype=x.dtype)\n    buf.copy_(x * 3.0)", "..."),
    "empty_like": ("buf = torch.empty_like(x)\n    buf.copy_(x * 3.0)", "..."),
    "a temporary": ("buf = x * 1.0\n    buf.copy_(x * 3.0)", "..."),
    "a row": (
        "buf = torch.zeros(3, 4, dtype=x.dtype)\n    buf[1].copy_(x[1] * 3.0)",
        "1",
    ),
    "a slice": (
        "buf = torch.zeros(3, 4, dtype=x.dtype)\n    buf[1:2].copy_(x[1:2] * 3.0)",
        "1:2",
    ),
}


@pytest.mark.parametrize("case", sorted(COPIES))
def test_copy_into_a_buffer_is_a_store(case, tmp_path):
    """`buf.copy_(v)` is `buf[...] = v`, and `buf[1].copy_(v)` is `buf[1] = v` (a
    basic index is a view): written `buf = _setitem(buf, ..., v)` as a store is.
    Filling a buffer this way was refused (no out-of-place twin): orders 1-3."""
    body, part = COPIES[case]
    source = (
        "import torch\n\n\n"
        "def f(x: torch.Tensor, w: torch.Tensor):\n"
        f"    {body}\n"
        "    def backward(g):\n"
        "        s = torch.zeros_like(x)\n"
        f"        s[{part}] = 3.0\n"
        "        return g * w * s, g * buf\n"
        "    return buf * w, backward\n"
    )
    if case == "a temporary":
        source = source.replace("s = torch.zeros_like(x)", "s = torch.ones_like(x)")
    closures, generated = import_pair(tmp_path, source, "copies")
    assert "buf = _setitem(buf, " in transform(source, "m.py", "m")
    values = [torch.randn(3, 4, dtype=F64), torch.randn(4, dtype=F64)]
    expected = derivatives(lambda *t: closures.f(*t)[0], leaves(values))
    assert_same(derivatives(generated.f, leaves(values)), expected)
