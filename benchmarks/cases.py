"""Benchmark inputs: one factory per sample differentiator, at three sizes.

A factory takes a size name (`tiny`, `medium`, `large`) and returns `(args, kwargs)` of
float32 tensors and plain values, exactly as the source differentiator is called.
Every floating-point tensor argument is a differentiable input of the benchmark.

Sizes are chosen per kind of op so that `tiny` measures per-call overhead, `medium` a
typical activation, and `large` a bandwidth- or FLOP-bound call that still runs in well
under a second on one core (see `SHAPES` for what each op gets).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SIZES = ("tiny", "medium", "large")

Args = tuple[tuple[Any, ...], dict[str, Any]]

# (rows, cols) of the 2-D elementwise / row-wise ops.
ROWS_COLS = {"tiny": (4, 8), "medium": (256, 512), "large": (2048, 2048)}
# (batch, sequence length, head dim) of q, k, v for attention.
BLD = {"tiny": (1, 4, 8), "medium": (4, 128, 64), "large": (8, 512, 64)}
# (N, d_in, d_hidden, d_out) of the MLP blocks.
MLP = {
    "tiny": (4, 8, 16, 8),
    "medium": (256, 256, 512, 256),
    "large": (1024, 512, 1024, 512),
}


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def _rc(size: str) -> tuple[int, int]:
    return ROWS_COLS[size]


def _mlp(size: str) -> Args:
    n, d_in, d_h, d_out = MLP[size]
    scale_1, scale_2 = d_in**-0.5, d_h**-0.5
    return (
        _r(n, d_in),
        _r(d_in, d_h) * scale_1,
        _r(d_h),
        _r(d_h, d_out) * scale_2,
        _r(d_out),
    ), {}


def _attention(size: str) -> Args:
    b, length, d = BLD[size]
    return (_r(b, length, d), _r(b, length, d), _r(b, length, d)), {}


def _rowwise(size: str) -> Args:
    return (_r(*_rc(size)),), {}


def _binary(size: str) -> Args:
    return (_r(*_rc(size)), _r(*_rc(size))), {}


#: (module, function) -> factory(size) -> (args, kwargs)
FACTORIES: dict[tuple[str, str], Callable[[str], Args]] = {
    ("elementwise", "mul"): lambda s: ((_r(*_rc(s)), _r(_rc(s)[1])), {}),
    ("elementwise", "scaled_mul"): lambda s: ((_r(*_rc(s)), _r(*_rc(s)), 2.5), {}),
    ("elementwise", "div"): lambda s: ((_r(*_rc(s)), _pos(_rc(s)[1])), {}),
    ("temporary", "add_mul"): _binary,
    ("temporary", "squared_distance"): _binary,
    ("reductions", "sum_dim"): lambda s: ((_r(*_rc(s)), -1), {}),
    ("reductions", "mean_dim"): lambda s: ((_r(*_rc(s)), -1), {}),
    ("reductions", "sum_all"): _rowwise,
    ("normalization", "layer_norm"): lambda s: (
        (_r(*_rc(s)), _r(_rc(s)[1]), _r(_rc(s)[1])),
        {},
    ),
    ("normalization", "rms_norm"): lambda s: ((_r(*_rc(s)), _r(_rc(s)[1])), {}),
    ("softmax", "softmax"): lambda s: ((_r(*_rc(s)), -1), {}),
    ("softmax", "log_softmax"): lambda s: ((_r(*_rc(s)), -1), {}),
    ("attention", "attention"): _attention,
    ("attention", "causal_attention"): _attention,
    ("mlp", "mlp"): _mlp,
    ("mlp", "relu_mlp"): _mlp,
    ("multi_output", "mean_var"): lambda s: ((_r(*_rc(s)), -1), {}),
    ("multi_output", "sincos"): _rowwise,
    ("options", "leaky_relu"): lambda s: ((_r(*_rc(s)),), {"negative_slope": 0.1}),
    ("options", "clamp_scale"): lambda s: (
        (_r(*_rc(s)), -0.5, 0.7),
        {"scale": 3.0, "leaky": True},
    ),
}

#: How each op's inputs are shaped, for the report (by kind of op).
SHAPE_NOTES = {
    "2-D elementwise and row-wise ops (x of (rows, cols); `mul`/`div` broadcast b of (cols,);"
    " norms take weight/bias of (cols,); reductions and softmax use dim=-1)": {
        s: "x ({}, {})".format(*ROWS_COLS[s]) for s in SIZES
    },
    "attention, causal_attention (q, k, v of (batch, length, d))": {
        s: "q,k,v ({}, {}, {})".format(*BLD[s]) for s in SIZES
    },
    "mlp, relu_mlp (x (N, d_in), w1 (d_in, d_h), b1 (d_h), w2 (d_h, d_out), b2 (d_out))": {
        s: "N={}, d_in={}, d_h={}, d_out={}".format(*MLP[s]) for s in SIZES
    },
}


def make_inputs(module: str, name: str, size: str, seed: int = 0) -> Args:
    """The (args, kwargs) of `module.name` at `size`, reproducibly."""
    torch.manual_seed(seed)
    return FACTORIES[(module, name)](size)
