"""Load the derivative rules: differentiators in `rules.py`, found by qualified name.

Takes the source of `s2sgrad/autodiff/rules.py` (or of a user's module, for user rules)
and returns `Rule` records: each rule's parameters with their defaults, its backward body
and, per parameter, the gradient expression (None where the parameter gets none). Rules
go through s2sgrad's own frontend, so a rule is checked like any user differentiator.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from s2sgrad.cst import findall
from s2sgrad.frontend import parse
from s2sgrad.frontend.model import Differentiator


@dataclass(frozen=True)
class Rule:
    """One derivative rule, ready to be inlined."""

    name: str
    params: tuple[str, ...]
    defaults: Mapping[str, cst.BaseExpression]
    #: The backward body without its final return.
    body: tuple[cst.BaseStatement, ...]
    #: Per parameter: its gradient expression, or None for a literal `None`.
    entries: tuple[cst.BaseExpression | None, ...]
    grad: str
    #: The name forward binds the result to (`out`), read by some backwards.
    out: str | None
    #: Parameters backward reads only through `.shape`, `.dim()` and the like.
    metadata_only: frozenset[str] = frozenset()
    #: The collected remaining positional arguments, for varargs spellings.
    varargs: str | None = None
    #: Parameters backward tests with `isinstance(p, torch.Tensor)`: where the call's
    #: argument is known to be a tensor, or a number, the test is settled when inlined.
    type_tested: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Registry:
    rules: Mapping[str, Rule]


def rule_from(diff: Differentiator) -> Rule | None:
    """Build a rule from a differentiator whose backward ends in its only return."""
    body = (
        list(diff.backward.body.body)
        if isinstance(diff.backward.body, cst.IndentedBlock)
        else []
    )
    if not body or not m.matches(body[-1], m.SimpleStatementLine(body=[m.Return()])):
        return None
    returns = findall(diff.backward.body, m.Return())
    if len(returns) != 1 or len(diff.grad_params) != 1:
        return None
    final = body[-1]
    assert isinstance(final, cst.SimpleStatementLine)
    ret = final.body[0]
    assert isinstance(ret, cst.Return) and ret.value is not None
    n = len(diff.params)
    if isinstance(ret.value, cst.Tuple) and len(ret.value.elements) == n:
        values = [e.value for e in ret.value.elements]
    elif n == 1:
        values = [ret.value]
    else:
        return None
    entries = tuple(None if m.matches(v, m.Name("None")) else v for v in values)
    defaults = {
        p.name: p.node.default for p in diff.params if p.node.default is not None
    }
    out = diff.outputs[0].value if isinstance(diff.outputs[0], cst.Name) else None
    params = tuple(p.name for p in diff.params)
    tested = {
        test.args[0].value.value
        for test in findall(diff.backward.body, TENSOR_TEST)
        if isinstance(test, cst.Call) and isinstance(test.args[0].value, cst.Name)
    }
    return Rule(
        diff.name,
        params,
        defaults,
        tuple(body[:-1]),
        entries,
        diff.grad_params[0],
        out,
        frozenset(c.name for c in diff.captures if c.metadata_only),
        type_tested=frozenset(tested & set(params)),
    )


#: `isinstance(name, torch.Tensor)`, the one type test a rule's backward may settle.
TENSOR_TEST = m.Call(
    func=m.Name("isinstance"),
    args=[m.Arg(m.Name()), m.Arg(m.Attribute(m.Name("torch"), m.Name("Tensor")))],
)


def _table(module: cst.Module, name: str) -> dict[str, str]:
    """Read a module-level `NAME = {"key": value_name, ...}` dict literal."""
    table: dict[str, str] = {}
    for statement in module.body:
        if not m.matches(
            statement,
            m.SimpleStatementLine(
                body=[m.Assign(targets=[m.AssignTarget(m.Name(name))])]
            ),
        ):
            continue
        assert isinstance(statement, cst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Dict)
        for element in assign.value.elements:
            if isinstance(element, cst.DictElement) and isinstance(
                element.key, cst.SimpleString
            ):
                value = element.value
                text = (
                    value.value
                    if isinstance(value, cst.Name)
                    else (
                        str(value.evaluated_value)
                        if isinstance(value, cst.SimpleString)
                        else ""
                    )
                )
                table[str(element.key.evaluated_value)] = text
    return table


class _LazyRules(Mapping[str, Rule]):
    """Rules by qualified name, each parsed the first time it is asked for.

    A conversion needs a handful of the rules; parsing one rule runs the frontend on that
    function alone, so start-up cost follows the rules used, not the size of rules.py.
    """

    def __init__(self, module: cst.Module, header: str) -> None:
        self.functions = {
            s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)
        }
        self.names = _table(module, "RULES")
        self.varargs = _table(module, "VARARGS")
        self.header = header
        self.built: dict[str, Rule] = {}

    def _rule(self, name: str) -> Rule:
        if name not in self.built:
            source = self.header + cst.Module([]).code_for_node(self.functions[name])
            (diff,) = parse(source, f"s2sgrad/autodiff/rules.py:{name}").differentiators
            rule = rule_from(diff)
            if rule is None:
                raise AssertionError(f"rule {name} does not follow the rule format")
            self.built[name] = rule
        return self.built[name]

    def __getitem__(self, qualified: str) -> Rule:
        rule = self._rule(self.names[qualified])
        if qualified in self.varargs:
            rule = dataclasses.replace(rule, varargs=self.varargs[qualified])
        return rule

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


@functools.cache
def builtin_registry() -> Registry:
    """Return the rules shipped in `s2sgrad/autodiff/rules.py`, by qualified name."""
    source = (
        importlib.resources.files("s2sgrad.autodiff")
        .joinpath("rules.py")
        .read_text("utf-8")
    )
    module = cst.parse_module(source)
    imports = [
        s
        for s in module.body
        if m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
    ]
    header = "".join(cst.Module([]).code_for_node(s) for s in imports)
    return Registry(_LazyRules(module, header))
