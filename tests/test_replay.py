"""Plain values forward computes are computed again in setup_context (codegen/replay.py).

A number, bool or string that forward computes from non-tensor parameters, tensor
parameters' metadata and literal constants is no extra output of the Function's forward
(torch.compile refuses a float there); anything else still travels: a value that reads
a tensor's data, a temporary, or a list that a loop fills. Each case is checked at
orders 1-3, pure and mixed, against autograd through the closure's forward.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from oracle import assert_same, derivatives, leaves

from s2sgrad import transform

SOURCE = '''
import math
import torch

SLOPE = 0.01


def leaky(x: torch.Tensor, slope_on: bool = True):
    if slope_on:
        slope = SLOPE
    else:
        slope = 0.0
    y = torch.where(x > 0, x, slope * x)
    def backward(g):
        return torch.where(x > 0, g, slope * g), None
    return y, backward


def rms(x: torch.Tensor):
    n = x.shape[-1]
    scale = 1.0 / math.sqrt(n)
    y = x * scale
    def backward(g):
        return g * scale
    return y, backward


def by_data(x: torch.Tensor):
    s = float(x.detach().abs().max())
    y = x / s
    def backward(g):
        return g / s
    return y, backward


def by_a_filled_list(x: torch.Tensor):
    hs = []
    for i in range(2):
        hs.insert(0, torch.tanh(x * (i + 1.0)))
    t = sum(hs)
    k = len(t.shape) + 1
    y = t / k
    def backward(g):
        return g / k * sum((i + 1.0) * (1.0 - h * h) for i, h in enumerate(reversed(hs)))
    return y, backward
'''

REPLAYED = {"leaky": True, "rms": True, "by_data": False, "by_a_filled_list": False}


@pytest.fixture(scope="module")
def modules() -> Any:
    """(generated namespace, source namespace, generated text); the source importable
    as `replay_cases`, whose constant the generated module imports."""
    source = types.ModuleType("replay_cases")
    exec(compile(SOURCE, "replay_cases.py", "exec"), source.__dict__)
    sys.modules["replay_cases"] = source
    try:
        text = transform(SOURCE, "replay_cases.py", "replay_cases")
        generated: dict[str, Any] = {"__name__": "replay_cases_grad"}
        exec(compile(text, "replay_cases_grad.py", "exec"), generated)
        yield generated, source.__dict__, text
    finally:
        del sys.modules["replay_cases"]


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_op_is_right_at_every_order(modules, name):
    generated, source, _ = modules
    x = torch.randn(3, 4, dtype=torch.float64)
    got = derivatives(generated[name], leaves([x]))
    want = derivatives(lambda v: source[name](v)[0], leaves([x]))
    assert_same(got, want, what=f"{name}: ")


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_only_plain_values_from_inputs_are_computed_again(modules, name):
    text = modules[2]
    function = "".join(p.title() for p in name.split("_")) + "Function"
    setup = text.split(f"class {function}")[1].split("def backward")[0]
    setup = setup.split("def setup_context")[1]
    computes = any(
        line.strip().startswith(("slope = ", "scale = ", "s = ", "k = "))
        for line in setup.splitlines()
    )
    assert computes == REPLAYED[name], setup
