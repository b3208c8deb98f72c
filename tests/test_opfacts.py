"""The op facts table: rebuilt from the installed torch, it must equal the committed one.

Also pins the facts other stages rely on, each checked against torch itself where a
call can show it (an op that may return its input object really does; a no-gradient op
really gives no gradient).
"""

from __future__ import annotations

import pytest
import torch

from s2sgrad import opfacts
from s2sgrad.opfacts import build, table


def test_table_matches_the_installed_torch():
    rebuilt = build.render()
    committed = build.table_path().read_text("utf-8")
    assert rebuilt == committed, (
        "s2sgrad/opfacts/table.py is stale for the installed torch; refresh it with "
        "`python -m s2sgrad.opfacts.build` and review the diff"
    )


def test_table_records_the_torch_it_was_built_from():
    assert table.TORCH_VERSION == torch.__version__.split("+")[0]


@pytest.mark.parametrize(
    "qualified, returns",
    [
        ("torch.ops.aten._size_if_not_equal", {("i[]?",)}),
        ("torch.split", {("T[]",)}),
        ("torch.Tensor.unbind", {("T[]",)}),
        ("torch.meshgrid", {("T[]",)}),
        ("torch.is_nonzero", {("b",)}),
        ("torch.Tensor.size", {("i",), ("i[]",)}),
        ("torch.nn.functional.relu", {("T",)}),
        ("torch.Tensor.long", {("T'",)}),
    ],
)
def test_return_kinds_come_from_the_schemas(qualified, returns):
    assert {s.returns for s in opfacts.signatures(qualified)} >= returns


def test_an_index_output_carries_no_gradient():
    (by_dim,) = [s for s in opfacts.signatures("torch.Tensor.max") if s.overload == "dim"]
    assert by_dim.returns == ("T", "T'")


def test_named_tuple_results_carry_their_field_names():
    (by_dim,) = [s for s in opfacts.signatures("torch.Tensor.max") if s.overload == "dim"]
    assert by_dim.fields == ("values", "indices")
    assert type(torch.randn(2, 3).max(1)).__match_args__ == by_dim.fields
    (slogdet,) = opfacts.signatures("torch.linalg.slogdet")
    assert slogdet.fields == type(torch.linalg.slogdet(torch.eye(2))).__match_args__
    assert all(not s.fields for s in opfacts.signatures("torch.split"))


def test_boolean_dispatch_records_both_returns():
    flag, default, if_true, if_false = opfacts.dispatch("torch.nn.functional.max_pool2d")
    assert (flag, default) == ("return_indices", False)
    assert if_true.returns == ("T", "T") and if_false.returns == ("T",)


@pytest.mark.parametrize(
    "qualified",
    ["torch.argmax", "torch.Tensor.eq", "operator.lt", "torch.floor", "torch.zeros_like"],
)
def test_no_gradient_ops_really_give_none(qualified):
    assert opfacts.no_gradient(qualified)


@pytest.mark.parametrize("method", ["contiguous", "to", "type_as", "sum_to_size", "float"])
def test_ops_that_may_return_their_input(method):
    assert opfacts.returns_input(f"torch.Tensor.{method}")


@pytest.mark.parametrize("method", ["transpose", "reshape", "view_as", "mul", "exp"])
def test_ops_that_always_make_a_new_object(method):
    assert not opfacts.returns_input(f"torch.Tensor.{method}")


def test_views_random_and_inplace_twins():
    assert opfacts.is_view("torch.Tensor.transpose")
    assert not opfacts.is_view("torch.Tensor.exp")
    assert opfacts.is_random("torch.nn.functional.dropout")
    assert opfacts.is_random("torch.Tensor.bernoulli_")
    assert opfacts.out_of_place("mul_") == "mul"
    assert opfacts.out_of_place("index_put_") == "index_put"
    assert opfacts.out_of_place("zero_") is None  # `Tensor.zero` does not exist


def test_overload_binding():
    (split,) = opfacts.signatures("torch.split")
    assert split.accepts(2, set()) and split.accepts(1, {"split_size_or_sections"})
    assert not split.accepts(1, {"tensor"})  # bound twice
    assert not split.accepts(4, set())
    assert not split.accepts(2, {"no_such_keyword"})


def test_detached_outputs_are_floating_statistics_not_indices():
    """Outputs torch returns without a gradient that hold floats (found from torch's
    derivative definitions, torchgen's single-`grad` rule included, and meta tensors)."""
    from s2sgrad import opfacts

    assert opfacts.detached_outputs("torch.native_layer_norm") == (1, 2)
    assert opfacts.detached_outputs("torch.ops.aten.native_batch_norm") == (1, 2)
    assert opfacts.detached_outputs("torch.max") == ()  # indices are integers
    assert opfacts.detached_outputs("torch.sort") == ()
    assert opfacts.detached_outputs("torch.layer_norm") == ()


def test_variadic_python_functions_take_tensors_one_by_one():
    """`torch.einsum(eq, a, b)` takes tensors as `*args` although its schema says
    `Tensor[]`: an unannotated parameter passed there is not a list (no S2S125)."""
    from s2sgrad import opfacts

    assert opfacts.variadic("torch.einsum")
    assert opfacts.variadic("torch.meshgrid")
    assert not opfacts.variadic("torch.stack")


@pytest.mark.parametrize(
    "qualified",
    [
        "torch._C._nn.adaptive_avg_pool2d",
        "torch._C._VariableFunctions.cat",
        "torch._C._linalg.linalg_vector_norm",
        "torch._C._special.special_erfcx",
        "torch._C._fft.fft_rfft",
    ],
)
def test_the_C_namespaces_hold_the_aten_operators_of_their_names(qualified):
    """What `torch.nn.functional` and `torch.linalg` wrap is looked up as the same op,
    and the name really is that Python function."""
    module, _, name = qualified.rpartition(".")
    assert callable(getattr(eval(module, {"torch": torch}), name))
    assert opfacts.aten_name(qualified) == name
    assert opfacts.signatures(qualified)


@pytest.mark.parametrize(
    "qualified,keywords,known",
    [
        ("torch.nonzero", {"as_tuple"}, False),  # Python's binding returns a tuple
        ("torch.Tensor.nonzero", {"as_tuple"}, False),
        ("torch.tensordot", {"dims"}, True),  # written in Python: its own keywords
        ("torch.Tensor.unique", {"return_inverse"}, True),
        ("torch.sum", {"axis", "keepdims"}, True),  # NumPy's spellings
        ("torch.softmax", {"dim", "dtype"}, True),
    ],
)
def test_keywords_a_call_binds(qualified, keywords, known):
    assert opfacts.keywords_known(qualified, keywords) is known


def test_python_functions_are_the_wrappers():
    import types

    assert isinstance(torch.tensordot, types.FunctionType)
    assert "torch.tensordot" in table.WRAPPERS
    assert not isinstance(torch.nonzero, types.FunctionType)
    assert "torch.nonzero" not in table.WRAPPERS
