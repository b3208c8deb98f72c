"""Load the derivative rules: differentiators in `rules.py`, found by qualified name.

Takes the source of `s2sgrad/autodiff/rules.py` (or of a user's module, for user rules)
and returns `Rule` records: each rule's parameters with their defaults, its backward body
and, per parameter, the gradient expression (None where the parameter gets none). Rules
go through s2sgrad's own frontend, so a rule is checked like any user differentiator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.resources
import importlib.util
import os
import pickle
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import libcst as cst
from libcst._version import __version__ as libcst_version

from s2sgrad.cst import assigned_name, calls_name, findall, is_name, sole
from s2sgrad.files import write_atomic
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
    if not body or sole(body[-1], cst.Return) is None:
        return None
    returns = findall(diff.backward.body, cst.Return)
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
    entries = tuple(None if is_name(v, "None") else v for v in values)
    defaults = {
        p.name: p.node.default for p in diff.params if p.node.default is not None
    }
    out = diff.outputs[0].value if isinstance(diff.outputs[0], cst.Name) else None
    params = tuple(p.name for p in diff.params)
    tested = {
        test.args[0].value.value
        for test in findall(diff.backward.body, cst.Call, is_tensor_test)
        if isinstance(test.args[0].value, cst.Name)
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


def is_tensor_test(node: object) -> TypeGuard[cst.Call]:
    """Whether `node` is `isinstance(name, torch.Tensor)`, the one type test a rule's
    backward may settle (two arguments, whatever their keywords or stars)."""
    if not calls_name(node, "isinstance") or len(node.args) != 2:
        return False
    tested, kind = node.args[0].value, node.args[1].value
    return (
        is_name(tested)
        and type(kind) is cst.Attribute
        and is_name(kind.value, "torch")
        and is_name(kind.attr, "Tensor")
    )


def _table(module: cst.Module, name: str) -> dict[str, str]:
    """Read a module-level `NAME = {"key": value_name, ...}` dict literal."""
    table: dict[str, str] = {}
    for statement in module.body:
        target = assigned_name(sole(statement, cst.Assign))
        if target is None or target.value != name:
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

    def __init__(
        self,
        names: dict[str, str],
        varargs: dict[str, str],
        built: dict[str, Rule],
        module: cst.Module | None = None,
    ) -> None:
        self.names = names
        self.varargs = varargs
        self.built = built
        self.functions: dict[str, cst.FunctionDef] = {}
        self.header = ""
        if module is not None:
            self.functions = {
                s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)
            }
            imports = [
                s
                for s in module.body
                if sole(s, cst.Import) is not None
                or sole(s, cst.ImportFrom) is not None
            ]
            self.header = "".join(cst.Module([]).code_for_node(s) for s in imports)

    @classmethod
    def of(cls, module: cst.Module) -> _LazyRules:
        return cls(_table(module, "RULES"), _table(module, "VARARGS"), {}, module)

    def _rule(self, name: str) -> Rule:
        if name not in self.built:
            source = self.header + cst.Module([]).code_for_node(self.functions[name])
            (diff,) = parse(source, f"s2sgrad/autodiff/rules.py:{name}").differentiators
            rule = rule_from(diff)
            if rule is None:
                raise AssertionError(f"rule {name} does not follow the rule format")
            self.built[name] = rule
        return self.built[name]

    def build_all(self) -> None:
        for name in self.functions:
            self._rule(name)

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
    """Return the rules shipped in `s2sgrad/autodiff/rules.py`, by qualified name.

    Built rules are kept beside rules.py's bytecode (see `_RuleCache`): a process that
    finds them there reads them in milliseconds instead of parsing every rule it uses.
    """
    source = (
        importlib.resources.files("s2sgrad.autodiff")
        .joinpath("rules.py")
        .read_text("utf-8")
    )
    cache = _RuleCache.of(source) if RULES_PATH.is_file() else None  # not in a zip
    rules = cache.read() if cache is not None else None
    if rules is None:
        rules = _LazyRules.of(cst.parse_module(source))
        if cache is not None and cache.writable():
            rules.build_all()
            cache.write(rules)
    return Registry(rules)


RULES_PATH = Path(__file__).with_name("rules.py")
#: Opens every cache entry; bump the number when the entry layout changes.
RULES_MAGIC = b"s2sgrad-rules 1\n"


@dataclass(frozen=True)
class _RuleCache:
    """The built rules, pickled into rules.py's `__pycache__` as Python keeps its
    bytecode there (`sys.pycache_prefix` and `PYTHONDONTWRITEBYTECODE` hold).

    An entry is used only when the key stored in it equals the key computed now: a
    digest of rules.py, of every source file of s2sgrad (whose frontend builds the
    rules), and of the interpreter and libcst that pickled them. Any failure to read,
    write or unpickle is a miss, and a miss parses the rules as if there were no cache.
    """

    entry: Path
    key: bytes

    @classmethod
    def of(cls, source: str) -> _RuleCache | None:
        tag = sys.implementation.cache_tag
        if tag is None:
            return None
        folder = Path(importlib.util.cache_from_source(str(RULES_PATH))).parent
        digest = hashlib.sha256()
        for part in (RULES_MAGIC, sys.version.encode(), libcst_version.encode()):
            digest.update(part + b"\0")
        digest.update(source.encode())
        package = RULES_PATH.parent.parent
        for path in sorted(package.rglob("*.py")):
            digest.update(path.relative_to(package).as_posix().encode() + b"\0")
            try:
                digest.update(path.read_bytes())
            except OSError:
                return None
        return cls(folder / f"rules.{tag}.s2sgrad-rules", digest.hexdigest().encode())

    def read(self) -> _LazyRules | None:
        try:
            with self.entry.open("rb") as file:
                if (
                    file.readline() != RULES_MAGIC
                    or file.readline() != self.key + b"\n"
                ):
                    return None
                names, varargs, built = pickle.load(file)
        except Exception:  # a missing, stale, truncated or foreign entry: a miss
            return None
        if not all(isinstance(d, dict) for d in (names, varargs, built)):
            return None
        return _LazyRules(names, varargs, built)

    def writable(self) -> bool:
        if sys.dont_write_bytecode:
            return False
        try:
            self.entry.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return False
        return os.access(self.entry.parent, os.W_OK)

    def write(self, rules: _LazyRules) -> None:
        data = pickle.dumps(
            (rules.names, rules.varargs, rules.built), pickle.HIGHEST_PROTOCOL
        )
        with contextlib.suppress(OSError):  # not cached: the next process parses
            write_atomic(self.entry, RULES_MAGIC + self.key + b"\n" + data, 0o644)
