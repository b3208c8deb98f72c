"""Parse a module and find its differentiators.

Takes source text and a display path; returns a `ParsedModule` whose differentiators
passed every check of the input language, or raises `TransformError` with all the
diagnostics found (every differentiator is checked, so one run reports every problem).
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    GlobalScope,
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    ScopeProvider,
)

from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend import checks
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.model import Differentiator, Param, ParsedModule
from s2sgrad.frontend.scopes import ScopeAnalysis, global_name

_PRAGMA = re.compile(r"#\s*s2sgrad:\s*([A-Za-z_-]+)\s*=\s*([A-Za-z0-9_.-]+)")


def decode_source(data: bytes, path: str) -> str:
    """Decode UTF-8 source bytes, or raise a located S2S002 diagnostic."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        message = f"source is not valid UTF-8 (byte 0x{data[exc.start]:02x})"
        raise TransformError(
            [
                Diagnostic(
                    "S2S002", message, path, line, column, "", "save the file as UTF-8"
                )
            ]
        ) from None


def parse(source: str, path: str) -> ParsedModule:
    """Parse `source` and return its checked differentiators."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        lines = source.splitlines()
        text = lines[exc.editor_line - 1] if 0 < exc.editor_line <= len(lines) else ""
        message = exc.message.removeprefix("parser error: ")
        raise TransformError(
            [
                Diagnostic(
                    "S2S001",
                    f"syntax error: {message}",
                    path,
                    exc.editor_line,
                    exc.editor_column,
                    text,
                )
            ]
        ) from None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    scopes = wrapper.resolve(ScopeProvider)
    loc = Locator(path, source, positions)
    analysis = ScopeAnalysis(
        scopes, wrapper.resolve(ParentNodeProvider), positions, loc
    )
    qualified = _qualified_names(wrapper)
    global_scope = next(s for s in scopes.values() if isinstance(s, GlobalScope))
    found: list[Diagnostic] = []
    records: list[Differentiator] = []
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef):
            continue
        if checks.is_lambda_backward(stmt):
            pair = checks.returned_pair(stmt)
            assert pair is not None
            found.append(
                loc.error(
                    "S2S109",
                    pair[1],
                    "backward must be a nested `def`, not a lambda",
                    "write `def backward(grad): ...` and return its name",
                )
            )
            continue
        bname = checks.backward_name(stmt)
        if bname is None:
            continue
        problems = checks.check_structure(stmt, bname, loc)
        if problems:
            found += problems
            continue
        record, problems = _build(stmt, bname, analysis, loc, qualified)
        found += problems
        if record is not None:
            records.append(record)
    if found:
        raise TransformError(sorted(found, key=lambda d: (d.line, d.column)))
    used = sorted({n for r in records for n in r.globals_used})
    globals_ = {
        n: global_name(n, global_scope) for n in used if n in _bound(global_scope)
    }
    return ParsedModule(
        path, source, module, tuple(records), globals_, _bound(global_scope)
    )


def _bound(scope: GlobalScope) -> frozenset[str]:
    return frozenset(a.name for a in scope.assignments)


def _qualified_names(wrapper: MetadataWrapper) -> dict[cst.CSTNode, str]:
    resolved = wrapper.resolve(QualifiedNameProvider)
    out: dict[cst.CSTNode, str] = {}
    for node, names in resolved.items():
        if isinstance(node, (cst.Name, cst.Attribute)):
            value = names() if callable(names) else names
            # Names through a function's locals (`f.<locals>.x.exp`) say nothing about
            # which library function runs; only module-level ones are kept.
            known = sorted(q.name for q in value if "<locals>" not in q.name)
            if known:
                out[node] = known[0]
    return out


def _build(
    forward: cst.FunctionDef,
    bname: str,
    analysis: ScopeAnalysis,
    loc: Locator,
    qualified: dict[cst.CSTNode, str],
) -> tuple[Differentiator | None, list[Diagnostic]]:
    backward = next(d for d in checks.nested_defs(forward) if d.name.value == bname)
    facts = analysis.analyse(forward, backward)
    if facts.diagnostics:
        return None, list(facts.diagnostics)
    pair = checks.returned_pair(forward)
    assert pair is not None
    result = pair[0]
    outputs = (
        tuple(e.value for e in result.elements)
        if isinstance(result, cst.Tuple)
        else (result,)
    )
    body = list(forward.body.body)
    if forward.get_docstring(clean=False) is not None:
        body = body[1:]
    statements = tuple(s for s in body[:-1] if s is not backward)
    grads = tuple(
        p.name.value for p in (*backward.params.posonly_params, *backward.params.params)
    )
    params = _params(forward, backward)
    first = loc.line_of(forward)
    last = analysis.positions[forward].end.line
    record = Differentiator(
        name=forward.name.value,
        forward=forward,
        params=params,
        statements=statements,
        backward=backward,
        grad_params=grads,
        result=result,
        outputs=outputs,
        tuple_result=isinstance(result, cst.Tuple),
        captures=facts.captures,
        docstring=forward.get_docstring(clean=True),
        first_line=first,
        last_line=last,
        backward_line=loc.line_of(backward),
        returns_bare_none=_returns_bare_none(backward),
        globals_used=facts.globals_used,
        local_names=facts.local_names | {p.name for p in params},
        qualified_names={
            k: v for k, v in qualified.items() if _inside(analysis, k, first, last)
        },
        statement_lines={
            node: pos.start.line
            for node, pos in analysis.positions.items()
            if isinstance(node, cst.BaseStatement) and first <= pos.start.line <= last
        },
        pragmas=_pragmas(forward),
    )
    return record, []


def _inside(analysis: ScopeAnalysis, node: cst.CSTNode, first: int, last: int) -> bool:
    pos = analysis.positions.get(node)
    return pos is not None and first <= pos.start.line <= last


def _params(forward: cst.FunctionDef, backward: cst.FunctionDef) -> tuple[Param, ...]:
    p = forward.params
    ordered = [(x, False) for x in (*p.posonly_params, *p.params)]
    ordered += [(x, True) for x in p.kwonly_params]
    slots = _gradient_slots(backward, len(ordered))
    code = cst.Module([]).code_for_node
    return tuple(
        Param(
            name=param.name.value,
            node=param,
            keyword_only=kw,
            annotation=code(param.annotation.annotation) if param.annotation else None,
            gets_gradient=slots[i],
        )
        for i, (param, kw) in enumerate(ordered)
    )


def _gradient_slots(backward: cst.FunctionDef, n: int) -> list[bool]:
    """Tell, per forward parameter, whether some return of backward may give a gradient."""
    slots = [False] * n
    for ret in m.findall(backward.body, m.Return()):
        assert isinstance(ret, cst.Return)
        value = ret.value
        if value is None or m.matches(value, m.Name("None")):
            continue
        if isinstance(value, cst.Tuple) and len(value.elements) == n:
            for i, element in enumerate(value.elements):
                if not m.matches(element.value, m.Name("None")):
                    slots[i] = True
        else:
            slots = [True] * n
    return slots


def _returns_bare_none(backward: cst.FunctionDef) -> bool:
    return any(
        isinstance(r, cst.Return)
        and (r.value is None or m.matches(r.value, m.Name("None")))
        for r in m.findall(backward.body, m.Return())
    )


def _pragmas(forward: cst.FunctionDef) -> dict[str, str]:
    """Read `# s2sgrad: key=value` comments above the def and inside it."""
    found: dict[str, str] = {}
    for comment in m.findall(forward, m.Comment()):
        assert isinstance(comment, cst.Comment)
        for key, value in _PRAGMA.findall(comment.value):
            found[key] = value
    return found
