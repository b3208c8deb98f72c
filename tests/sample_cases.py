"""The sample differentiators' test inputs, shared by the closure and generated-code tests.

Each case is (module, function, id, factory); factory() returns (args, kwargs) of float64
tensors and plain values, and is called after `torch.manual_seed`.

Samples are tried the way people use them, not only at equal shapes: a parameter that
broadcasts against another (a bias or a centre shared by every row, keys and values
shared across a batch of queries, a 0-d scale), whose gradient the closure may return
unreduced as PyTorch allows, and Python numbers of other types where a parameter takes
a number. A generated backward once added a promoted temporary's gradient, reduced, to
such an unreduced one and counted it once per row (issue 22).
"""

import importlib
import inspect
import pathlib

import torch

SAMPLES_DIR = pathlib.Path(__file__).resolve().parent.parent / "samples"
RTOL, ATOL = 1e-7, 1e-9


def r(*shape):
    return torch.randn(shape, dtype=torch.float64)


def pos(*shape):
    return torch.rand(shape, dtype=torch.float64) + 0.5


# (module, function, id, factory) -- factory() -> (args, kwargs); called after torch.manual_seed.
CASES = [
    ("elementwise", "mul", "broadcast", lambda: ((r(3, 4), r(4)), {})),
    ("elementwise", "mul", "broadcast_both", lambda: ((r(3, 1), r(1, 4)), {})),
    ("elementwise", "scaled_mul", "default", lambda: ((r(3, 4), r(3, 4)), {})),
    ("elementwise", "scaled_mul", "alpha", lambda: ((r(3, 4), r(3, 4), 2.5), {})),
    ("elementwise", "scaled_mul", "int_alpha", lambda: ((r(3, 4), r(3, 4), 3), {})),
    ("elementwise", "div", "broadcast", lambda: ((r(3, 4), pos(4)), {})),
    ("temporary", "add_mul", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    ("temporary", "add_mul", "broadcast_row", lambda: ((r(3, 4), r(4)), {})),
    ("temporary", "add_mul", "broadcast_1xd", lambda: ((r(3, 4), r(1, 4)), {})),
    ("temporary", "squared_distance", "same_shape", lambda: ((r(3, 4), r(3, 4)), {})),
    ("temporary", "squared_distance", "broadcast_y", lambda: ((r(4, 5), r(5)), {})),
    ("reductions", "sum_dim", "dim1", lambda: ((r(2, 3, 4), 1), {})),
    ("reductions", "sum_dim", "neg_keepdim", lambda: ((r(2, 3, 4), -1, True), {})),
    ("reductions", "sum_dim", "kw_keepdim", lambda: ((r(2, 3, 4),), {"dim": 0, "keepdim": True})),
    ("reductions", "mean_dim", "dim0", lambda: ((r(2, 3, 4), 0), {})),
    ("reductions", "mean_dim", "neg2_keepdim", lambda: ((r(2, 3, 4), -2, True), {})),
    ("reductions", "sum_all", "3d", lambda: ((r(2, 3, 4),), {})),
    ("normalization", "layer_norm", "default_eps", lambda: ((r(2, 3, 5), r(5), r(5)), {})),
    ("normalization", "layer_norm", "eps", lambda: ((r(4, 6), r(6), r(6)), {"eps": 1e-3})),
    ("normalization", "rms_norm", "default_eps", lambda: ((r(2, 3, 5), r(5)), {})),
    ("normalization", "rms_norm", "eps", lambda: ((r(4, 6), r(6)), {"eps": 1e-2})),
    ("normalization", "layer_norm", "broadcast_affine", lambda: ((r(2, 3, 5), r(), r(1, 5)), {})),
    ("normalization", "rms_norm", "row_scale", lambda: ((r(2, 3, 5), r(3, 1)), {})),
    ("softmax", "softmax", "default_dim", lambda: ((r(3, 5),), {})),
    ("softmax", "softmax", "dim0", lambda: ((r(3, 5), 0), {})),
    ("softmax", "log_softmax", "default_dim", lambda: ((r(3, 5),), {})),
    ("softmax", "log_softmax", "dim1", lambda: ((r(2, 3, 4),), {"dim": 1})),
    ("attention", "attention", "batched", lambda: ((r(2, 3, 4), r(2, 5, 4), r(2, 5, 6)), {})),
    ("attention", "attention", "unbatched", lambda: ((r(3, 4), r(3, 4), r(3, 2)), {})),
    ("attention", "causal_attention", "square", lambda: ((r(2, 4, 3), r(2, 4, 3), r(2, 4, 5)), {})),
    ("attention", "causal_attention", "longer_keys", lambda: ((r(2, 3, 4), r(2, 5, 4), r(2, 5, 2)), {})),
    ("attention", "attention", "shared_kv", lambda: ((r(2, 3, 4), r(5, 4), r(5, 6)), {})),
    ("attention", "causal_attention", "shared_kv", lambda: ((r(2, 3, 4), r(5, 4), r(5, 2)), {})),
    ("mlp", "mlp", "tanh", lambda: ((r(5, 3), r(3, 4), r(4), r(4, 2), r(2)), {})),
    ("mlp", "mlp", "scalar_biases", lambda: ((r(5, 3), r(3, 4), r(), r(4, 2), r()), {})),
    ("mlp", "relu_mlp", "relu", lambda: ((r(5, 3), r(3, 4), r(4), r(4, 2), r(2)), {})),
    ("mlp", "relu_mlp", "scalar_biases", lambda: ((r(5, 3), r(3, 4), r(), r(4, 2), r()), {})),
    ("multi_output", "mean_var", "default_dim", lambda: ((r(3, 5),), {})),
    ("multi_output", "mean_var", "dim0", lambda: ((r(4, 3), 0), {})),
    ("multi_output", "sincos", "2d", lambda: ((r(3, 4),), {})),
    ("options", "leaky_relu", "default", lambda: ((r(4, 5),), {})),
    ("options", "leaky_relu", "slope", lambda: ((r(4, 5),), {"negative_slope": 0.2})),
    ("options", "clamp_scale", "default", lambda: ((r(4, 5), -0.5, 0.7), {})),
    ("options", "clamp_scale", "leaky", lambda: ((r(4, 5), -0.5, 0.7), {"scale": 3.0, "leaky": True})),
    ("options", "clamp_scale", "int_options", lambda: ((r(4, 5), -1, 1), {"scale": 3})),
]


def load(module, name):
    return getattr(importlib.import_module(f"samples.{module}"), name)


def is_grad_tensor(v):
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def prepare(module, name, factory, seed):
    """Return fn, args, kwargs (float tensors requiring grad) and the per-parameter values."""
    fn = load(module, name)
    torch.manual_seed(seed)
    args, kwargs = factory()
    args = [a.clone().requires_grad_() if is_grad_tensor(a) else a for a in args]
    kwargs = {k: (v.clone().requires_grad_() if is_grad_tensor(v) else v) for k, v in kwargs.items()}
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    params = [bound.arguments[p] for p in sig.parameters]
    return fn, args, kwargs, params


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def call_with(target, fn, params, tensors):
    """Call `target` (fn, its op, or its forward) with fn's `params`, the differentiable
    ones replaced by `tensors` in order; keyword-only parameters go by keyword."""
    values = list(params)
    positions = [i for i, p in enumerate(params) if is_grad_tensor(p)]
    for i, t in zip(positions, tensors, strict=True):
        values[i] = t
    args, kwargs = [], {}
    for value, (name, p) in zip(values, inspect.signature(fn).parameters.items(), strict=True):
        if p.kind == p.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    return target(*args, **kwargs)
