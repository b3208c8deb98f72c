"""`compile=true`: Functions whose f_forward and f_backward run inductor-compiled.

Every sample converted with the option, at orders 1-3 against torch.autograd of the
closure's own forward (float64, small shapes; tests/conftest.py shares one inductor
cache). Then the pitfalls of compiled double backward: saved values that depend on each
other, a backward run twice, `no_grad`; many shapes; no graph breaks; the option's
three spellings, the hook, and the error where inductor cannot compile.
"""

import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch
from sample_cases import ATOL, CASES, RTOL, as_tuple, is_grad_tensor, load, prepare

from s2sgrad import transform

ROOT = Path(__file__).resolve().parent.parent
PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


_MODULES: dict[str, types.ModuleType] = {}


def compiled_module(module: str) -> types.ModuleType:
    """samples/<module>.py converted with compile=True, imported under its own name."""
    if module not in _MODULES:
        path = ROOT / "samples" / f"{module}.py"
        text = transform(
            path.read_text(), f"samples/{module}.py", f"samples.{module}", compile=True
        )
        assert "_compiled(" in text
        gen = types.ModuleType(f"samples.{module}_compiled_grad")
        exec(compile(text, f"{module}_compiled_grad.py", "exec"), gen.__dict__)
        _MODULES[module] = gen
    return _MODULES[module]


def _orders(outs, tensors, seed):
    """Gradients of orders 1-3 of random weighted sums. Each order is taken twice: first
    without create_graph (the compiled backward of that order: f_backward at order 1,
    f_backward's compiled joint graph at order 2) and then with it (its node's second
    backward: the eager path), which the next order differentiates."""
    gen = torch.Generator().manual_seed(seed)
    level = [o for o in as_tuple(outs) if o.requires_grad]
    found = []
    for _ in range(3):
        weights = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in level]
        pairs = [(o, w) for o, w in zip(level, weights, strict=True) if o.requires_grad]
        outputs, cotangents = [o for o, _ in pairs], [w for _, w in pairs]
        for create in (False, True):
            grads = torch.autograd.grad(
                outputs,
                tensors,
                cotangents,
                retain_graph=True,
                create_graph=create,
                allow_unused=True,
                materialize_grads=True,
            )
            found.append(list(grads))
        level = list(grads)
    return found


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_compiled_op_matches_closure_at_orders_1_to_3(module, name, factory):
    op = getattr(compiled_module(module), name)
    closure = load(module, name)
    _, args, kwargs, params = prepare(module, name, factory, seed=0)
    tensors = [p for p in params if is_grad_tensor(p)]
    out = op(*args, **kwargs)
    ref, _ = closure(*args, **kwargs)
    for a, b in zip(as_tuple(out), as_tuple(ref), strict=True):
        _close(a, b, "output")
    got, want = _orders(out, tensors, 1), _orders(ref, tensors, 1)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (a, b) in enumerate(zip(g, w, strict=True)):
            how = "with" if k % 2 else "without"
            _close(a, b, f"order {k // 2 + 1} {how} create_graph, input {i}")


def test_dependent_saved_values_backward_twice_and_no_grad():
    """mlp saves tanh(x @ w1) beside x and w1: a differentiated backward must give
    partial derivatives, not total ones."""
    op = compiled_module("mlp").mlp
    closure = load("mlp", "mlp")
    torch.manual_seed(0)
    xs = [
        torch.randn(*s, dtype=torch.float64, requires_grad=True)
        for s in ((5, 3), (3, 4), (4,), (4, 2), (2,))
    ]
    out, ref = op(*xs), closure(*xs)[0]
    for f in (out, ref):
        f.sin().sum().backward(retain_graph=True)
    once = [x.grad.clone() for x in xs]
    for x in xs:
        x.grad = None
    out.sin().sum().backward(retain_graph=True)
    out.sin().sum().backward()
    for x, g in zip(xs, once, strict=True):
        _close(x.grad, g, "backward run twice")  # once for op, once for ref: 2 * (op's)
    with torch.no_grad():
        _close(op(*xs), closure(*xs)[0], "no_grad")
    got, want = _orders(op(*xs), xs, 2), _orders(closure(*xs)[0], xs, 2)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            _close(a, b, "orders")


#: (module, op, factory of its arguments for a leading size n): 16 shapes each.
SHAPED = [
    (
        "normalization",
        "layer_norm",
        lambda n: (r(1 + n % 5, 2 + n), r(2 + n), r(2 + n)),
    ),
    ("normalization", "rms_norm", lambda n: (r(n + 1, 6), r(6))),
    ("softmax", "log_softmax", lambda n: (r(n + 1, 3 + n % 4),)),
    ("attention", "attention", lambda n: (r(2, n + 1, 4), r(2, 3, 4), r(2, 3, 5))),
    ("mlp", "mlp", lambda n: (r(n + 1, 3), r(3, 4), r(4), r(4, 2), r(2))),
    ("multi_output", "sincos", lambda n: (r(n + 1, 2),)),
]


def r(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("module,name,factory", SHAPED, ids=[s[1] for s in SHAPED])
def test_sixteen_shapes_neither_fail_nor_fall_back(module, name, factory):
    op = getattr(compiled_module(module), name)
    closure = load(module, name)
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(16):
            xs = factory(n)
            got = _orders(op(*xs), list(xs), n)[:3]  # orders 1 and 2, compiled
            want = _orders(closure(*xs)[0], list(xs), n)[:3]
            for g, w in zip(got, want, strict=True):
                for a, e in zip(g, w, strict=True):
                    _close(a, e, f"shape {[tuple(x.shape) for x in xs]}")
    assert not [w for w in caught if "too many shapes" in str(w.message)]


def test_no_graph_breaks_on_the_samples():
    """fullgraph=True turns a graph break into an error, which the runtime reports
    instead of running eagerly; every sample ran above, this checks it is compiled."""
    torch._dynamo.utils.counters.clear()
    op = compiled_module("attention").attention
    q, k, v = (
        torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)
    )
    op(q, k, v).sum().backward()
    assert torch._dynamo.utils.counters["stats"]["calls_captured"] >= 2
    assert not torch._dynamo.utils.counters["graph_break"]


OPS = """
import torch


def square(x):  # s2sgrad: compile=false
    def backward(grad):
        return 2 * grad * x
    return x * x, backward


def cube(x):
    # s2sgrad: compile=true
    def backward(grad):
        return 3 * grad * x * x
    return x * x * x, backward
"""


def test_option_flag_config_pragma_and_hook(tmp_path):
    default = transform(OPS, "ops.py")
    assert "compiled_cube_forward = _compiled(cube_forward)" in default
    assert "compiled_square" not in default and "_compiled(square" not in default
    on = transform(OPS, "ops.py", compile=True)
    assert "compiled_square" not in on  # the pragma opts it out
    plain = transform(OPS.replace("# s2sgrad: compile=true", ""), "ops.py")
    assert "_compiled" not in plain and "warnings" not in plain
    (tmp_path / "ops.py").write_text(OPS.replace("# s2sgrad: compile=true", ""))
    (tmp_path / "pyproject.toml").write_text("[tool.s2sgrad]\ncompile = true\n")
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "convert", "ops.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "compiled_cube_forward" in (tmp_path / "ops_grad.py").read_text()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2sgrad",
            "convert",
            "--no-compile",
            "--stdout",
            "ops.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and "_compiled" not in run.stdout
    (tmp_path / "ops_grad.py").unlink()
    hooked = subprocess.run(
        [
            sys.executable,
            "-c",
            "import s2sgrad; s2sgrad.install_import_hook(); import ops_grad, inspect; print(inspect.getsource(ops_grad))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert hooked.returncode == 0, hooked.stderr
    assert "compiled_cube_forward = _compiled(cube_forward)" in hooked.stdout
    (tmp_path / "pyproject.toml").write_text("[tool.s2sgrad]\ncompile = 1\n")
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "convert", "ops.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "'compile' must be true, false or \"strict\"" in run.stderr


def test_without_a_cxx_compiler_the_op_runs_eagerly_or_says_so(tmp_path):
    """A compiled op keeps training where inductor cannot compile: the call runs the
    eager pair, with one warning that names the cause and how to turn compiling off;
    `compile="strict"` raises instead."""
    script = textwrap.dedent("""
        import warnings
        import torch
        from s2sgrad import transform
        x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        for mode in ("true", "strict"):
            source = open("ops.py").read().replace("compile=true", f"compile={mode}")
            namespace = {"__name__": "ops_grad"}
            text = transform(source, "ops.py")
            exec(compile(text, "ops_grad.py", "exec"), namespace)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    for _ in range(2):
                        (g,) = torch.autograd.grad(namespace["cube"](x).sum(), x)
                    print(mode, "RAN", bool(torch.allclose(g, 3 * x.detach() ** 2)))
                except RuntimeError as error:
                    print(mode, "ERROR", error)
            shown = [str(w.message) for w in caught if "s2sgrad compile=true" in str(w.message)]
            print(mode, "WARNINGS", len(shown), shown[0] if shown else "")
        """)
    (tmp_path / "ops.py").write_text(OPS)
    (tmp_path / "check.py").write_text(script)
    env = {
        **os.environ,
        "CXX": str(tmp_path / "no-such-compiler"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    run = subprocess.run(
        [sys.executable, "check.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "true RAN True" in out, out + run.stderr[-2000:]
    # One warning per compiled function that failed (cube_forward, cube_backward),
    # the first call; then they run eagerly without another.
    assert "true WARNINGS 2 `cube_forward` runs compiled (s2sgrad compile=true)" in out, out
    assert "# s2sgrad: compile=false" in out and 'compile = "strict"' in out, out
    assert "strict ERROR `cube_forward` runs compiled (s2sgrad compile=true)" in out, out
    assert "--compile" in out


@pytest.mark.parametrize("leaky", [True, False])
def test_a_plain_value_forward_computes_is_no_output_of_forward(leaky):
    """clamp_scale's `slope`, a float forward computes from `leaky`, is computed again
    in setup_context from the inputs: as an extra output of forward it made
    `torch.compile(fullgraph=True, dynamic=True)` refuse the op ("HOP body output
    unsupported ... got <class 'float'>")."""
    from samples.options import clamp_scale as closure
    from samples.options_grad import clamp_scale

    torch._dynamo.reset()
    compiled = torch.compile(
        lambda x: clamp_scale(x, -0.5, 0.7, leaky=leaky),
        fullgraph=True,
        dynamic=True,
        backend="eager",
    )
    for rows in (4, 6):  # a second shape: the dynamic graph
        x = torch.randn(rows, 5, dtype=torch.float64, requires_grad=True)
        (got,) = torch.autograd.grad(compiled(x).sum(), x)
        (want,) = torch.autograd.grad(closure(x, -0.5, 0.7, leaky=leaky)[0].sum(), x)
        _close(got, want, f"gradient, {rows} rows")
    text = (ROOT / "samples" / "options_grad.py").read_text()
    assert "return result, (inside,)\n" in text, "slope is not an output of forward"


def test_a_training_loop_that_changes_grad_mode_compiles_no_new_graph():
    """Training steps, evaluation under no_grad and a gradient penalty, in turn: after
    the first round every call finds its graph (grad mode inside backward makes no
    new one; a pattern of inputs that require grad compiles its own graph once), so
    torch never nears its recompile limit and never warns."""
    mlp = compiled_module("mlp").mlp
    torch.manual_seed(0)
    x = torch.randn(5, 3, dtype=torch.float64)
    params = [
        torch.randn(*shape, dtype=torch.float64, requires_grad=True)
        for shape in ((3, 4), (4,), (4, 2), (2,))
    ]
    counters = torch._dynamo.utils.counters

    def round_of_steps():
        mlp(x, *params).sum().backward()
        with torch.no_grad():
            mlp(x, *params)
        x2 = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(mlp(x2, *params).sum(), x2, create_graph=True)
        (g**2).sum().backward()

    before = counters["stats"]["unique_graphs"]
    round_of_steps()
    graphs = counters["stats"]["unique_graphs"]
    # f_forward once, f_backward for the first-order backward (with and without the
    # promoted gradient) and once under autograd for the double backward.
    assert graphs - before <= 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            round_of_steps()
    assert counters["stats"]["unique_graphs"] == graphs


POWER = """
import torch


def power(x, p: float):
    y = x ** p
    def backward(grad):
        return grad * p * x ** (p - 1), None
    return y, backward
"""


def test_a_float_that_changes_every_step_gives_the_eager_numbers(tmp_path):
    """A focal loss's `gamma` on a schedule: from its third value torch treats a float
    argument as symbolic, and inductor computed `p * x ** (p - 1)` wrongly for it (off
    by 0.17 at p = 1.5), silently; nothing raised, so nothing fell back. The compiled
    pair now takes floats as constants of the graph (a recompile per value)."""
    (tmp_path / "powers.py").write_text(POWER)
    text = transform(POWER, "powers.py", "powers", compile=True)
    generated = types.ModuleType("powers_grad")
    sys.path.insert(0, str(tmp_path))
    try:
        exec(compile(text, "powers_grad.py", "exec"), generated.__dict__)
    finally:
        sys.path.remove(str(tmp_path))
    x0 = torch.rand(6, dtype=torch.float64) + 0.5
    for p in (1.0, 1.25, 1.5, 1.75):
        x = x0.clone().requires_grad_()
        (got,) = torch.autograd.grad(generated.power(x, p).sum(), x)
        torch.testing.assert_close(got, p * x0 ** (p - 1), rtol=1e-12, atol=1e-12)
