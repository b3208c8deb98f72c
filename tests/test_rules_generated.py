"""Every derivative rule, converted by s2sgrad itself, passes gradcheck and gradgradcheck.

The rules are differentiators, so `s2sgrad.transform` turns `rules.py` into ops like any
user module; each op is checked on every example of tests/test_rules_closures.py, and
its orders 1 to 3 equal autograd through the rule's own forward, each order alone and
with the output and the earlier gradients in one loss (tests/oracle.py).
"""

import importlib.resources
import inspect

import pytest
import torch
from oracle import assert_same, derivatives

from s2sgrad import transform
from s2sgrad.autodiff import rules
from s2sgrad.autodiff.registry import builtin_registry

try:
    from test_rules_closures import EXAMPLES
except ImportError:  # tests/ imported as a package
    from tests.test_rules_closures import EXAMPLES

#: Examples an op cannot take, each checked elsewhere (tests/test_rules_closures.py checks
#: every example of every rule as a closure, at first and second order):
#: - a Python number as an operand: the op runs the rule's whole backward, whose entry
#:   for that operand reads `.shape`; generated VJP code only inlines tensor entries;
#: - ties and dtype changes: finite differences are not meaningful there;
#: - an exponent of exactly 0 in places: PyTorch gives x no gradient there (and
#:   s2sgrad's rule with it), which is not what finite differences in the exponent see.
NOT_FOR_OPS = ("ties", "dtype", "down", "up", "like_tensor", "zero_in")


def _rule(name):
    return next(r for r in builtin_registry().rules.values() if r.name == name)


@pytest.fixture(scope="module")
def rules_ops():
    source = importlib.resources.files("s2sgrad.autodiff").joinpath("rules.py").read_text()
    namespace: dict[str, object] = {}
    text = transform(source, "s2sgrad/autodiff/rules.py", "s2sgrad.autodiff.rules")
    exec(compile(text, "rules_grad.py", "exec"), namespace)
    return namespace


def _leaves(value):
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return []


def _rebuild(value, leaves):
    if isinstance(value, torch.Tensor):
        return next(leaves) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, leaves) for item in value)
    return value


CASES = [
    pytest.param(name, factory, id=f"{name}[{case}]")
    for name, case, factory in EXAMPLES
    if not any(word in case for word in NOT_FOR_OPS)
]


def _tensors(value):
    """A tensor, or a list or tuple of tensors (flattened into the Function)."""
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, torch.Tensor) for v in value)
    return isinstance(value, torch.Tensor)


@pytest.mark.parametrize("name,factory", CASES)
def test_rule_op_passes_gradcheck_and_gradgradcheck(rules_ops, name, factory):
    torch.manual_seed(0)
    args, kwargs = factory()
    leaves = [t.detach().clone().requires_grad_() for t in _leaves((args, kwargs))]
    if not leaves:
        pytest.skip("no differentiable input")
    op = rules_ops[name]
    rule = _rule(name)
    bound = inspect.signature(getattr(rules, name)).bind(*args, **kwargs)
    bound.apply_defaults()
    numbers = [p for p, e in zip(rule.params, rule.entries, strict=True)
               if e is not None and not _tensors(bound.arguments[p])]
    if numbers:
        pytest.skip(f"a Python number or None for {numbers}: checked as a closure")
    if all(entry is None for entry in rule.entries):
        out = op(*args, **kwargs)
        assert not any(o.requires_grad for o in _leaves(out)), "a no-gradient rule"
        return

    def call(*tensors):
        rebuilt_args, rebuilt_kwargs = _rebuild((args, kwargs), iter(tensors))
        return op(*rebuilt_args, **rebuilt_kwargs)

    assert torch.autograd.gradcheck(call, tuple(leaves))
    assert torch.autograd.gradgradcheck(call, tuple(leaves))

    def reference(*tensors):
        rebuilt_args, rebuilt_kwargs = _rebuild((args, kwargs), iter(tensors))
        return getattr(rules, name)(*rebuilt_args, **rebuilt_kwargs)[0]

    assert_same(
        derivatives(call, [t.detach().clone().requires_grad_() for t in leaves]),
        derivatives(reference, [t.detach().clone().requires_grad_() for t in leaves]),
    )
