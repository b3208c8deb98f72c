"""Lambda lifting: captures, their kinds, the context tuple, promotion decisions.

Takes a checked `Differentiator`; returns a `Lifted` record that says, for every value
backward reads from forward, what kind it is (DESIGN section 2), how forward computes it
for the context, how the `autograd.Function` keeps it (`save_for_backward` or a `ctx`
attribute) and whether it is promoted to an extra output. Invariant: the context holds
the captures in order of first reference in backward, each read at its last binding in
forward (Python's late binding), and backward's body reads exactly those names.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.cst import (
    assigned_name,
    bound,
    bound_target,
    code,
    dotted,
    findall,
    is_name,
    nodes,
    sole,
    spelled,
    walk,
)
from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend.model import Capture, Differentiator, Use
from s2sgrad.lines import line_text
from s2sgrad.names import NameAllocator
from s2sgrad.options import Options
from s2sgrad.values import (
    OTHER,
    SEQ,
    UNKNOWN,
    Evaluator,
    ModuleFacts,
    Value,
    forward_values,
)

Kind = Literal["input", "output", "temporary", "constant", "metadata"]
#: How the autograd Function keeps a value for backward: `tensor` (a tensor or None:
#: save_for_backward), `tensors` (a list or tuple of tensors: its elements are saved),
#: `object` (holds no tensor: a ctx attribute), `unknown` (decided at run time).
Storage = Literal["tensor", "tensors", "object", "unknown"]
_STORAGE_ORDER = {"tensor": 0, "tensors": 1, "object": 2, "unknown": 3}


def storage_of(value: Value) -> Storage:
    """How a value of this kind is kept for backward."""
    if value.tensor is True:
        return "tensor"
    if value.tensor_list and not value.fields:
        return "tensors"  # a named tuple (`x.max(dim)`) is rebuilt as its own type
    if not value.holds_tensor:
        return "object"
    return "unknown"


def in_context_order(entries: Iterable[Saved]) -> tuple[Saved, ...]:
    """Order context entries: tensors first, so that `ctx.saved_tensors` is a prefix of
    the context as is; within each storage, the order of first reference."""
    return tuple(sorted(entries, key=lambda s: _STORAGE_ORDER[s.storage]))


METADATA_CODE = {
    "shape": "{}.shape",
    "dim": "{}.dim()",
    "dtype": "{}.dtype",
    "device": "{}.device",
    "numel": "{}.numel()",
}


@dataclass(frozen=True)
class Saved:
    """One entry of the context tuple."""

    #: The name backward reads (the capture's name, or `x_shape` for metadata).
    name: str
    #: The forward name it comes from.
    source: str
    kind: Kind
    #: Forward expression that computes the entry at the end of forward.
    expression: str
    storage: Storage
    #: Promoted to an extra output whose gradient backward takes as `grad_<name>`.
    promoted: bool
    #: Position among the forward parameters (inputs) or outputs (outputs), also for
    #: the metadata of an input or an output (see `on`).
    index: int | None
    #: Line of the first read in backward.
    line: int
    #: Forward may bind it to an input object itself (`z = x`, `x.to(dtype)`), which
    #: autograd will not take back as an output to save: the Function returns a view.
    may_alias: bool = False
    #: Bound to None on the paths where the branch that computes it does not run.
    may_be_none: bool = False
    #: For metadata: `input` or `output` when it is read off a Function input or
    #: output (`setup_context` computes it), None when forward must pass it on.
    on: Kind | None = None

    @property
    def tensor(self) -> bool:
        """Saved with `save_for_backward` as one tensor."""
        return self.storage == "tensor"


@dataclass(frozen=True)
class Lifted:
    """A differentiator with its closure turned into an explicit context."""

    source: Differentiator
    context: tuple[Saved, ...]
    #: backward's body with metadata reads rewritten to the saved names.
    backward_body: cst.BaseSuite
    #: Forward values at the end of forward (tensor-ness, differentiability).
    values: Mapping[str, Value]
    #: Names taken in the lifted functions; later stages allocate from these.
    taken: frozenset[str]
    #: Whether a temporary is saved without promotion, so double backward must raise.
    first_order: bool
    #: The variables that hold each forward parameter's gradient in f_backward.
    results: tuple[str, ...]
    #: What each output of the result is (a tensor, a list of tensors...).
    outputs: tuple[Value, ...]
    #: Names that some binding in forward may make another name's object (an input's,
    #: perhaps): `aliasing_names`, computed once here for every later stage.
    aliases: frozenset[str]
    #: Names that some binding may make a view of another tensor, or an existing
    #: object (`aliases` and more): `viewing_names`.
    views: frozenset[str] = frozenset()

    @property
    def extras(self) -> tuple[Saved, ...]:
        """Context entries that forward must pass to `setup_context` as outputs."""
        return extras_of(self.context)


def extras_of(context: Iterable[Saved]) -> tuple[Saved, ...]:
    """The entries of a context that forward must pass to `setup_context` as outputs:
    what neither a Function input nor an output holds."""
    return tuple(
        s for s in context if s.kind not in ("input", "output") and s.on is None
    )


def lift(
    diff: Differentiator,
    options: Options,
    facts: ModuleFacts | None = None,
    evaluator: Evaluator | None = None,
) -> Lifted:
    """Classify the captures of `diff` and build its context.

    `facts` says what the module's other differentiators and helpers return;
    `evaluator`, when given, is `forward_values(diff, facts)` computed already.
    """
    if evaluator is None:
        evaluator = forward_values(diff, facts)
    values = evaluator.env
    outputs = tuple(evaluator.expr(o) for o in diff.outputs)
    rebound = rebound_names(diff)
    aliases = aliasing_names(diff)
    names = NameAllocator(diff.local_names | set(diff.grad_params))
    entries: list[tuple[tuple[int, int], Saved]] = []
    replacements: dict[cst.CSTNode, cst.BaseExpression] = {}
    for capture in diff.captures:
        if capture.metadata_only:
            on = origin(diff, capture.name, rebound)
            entries += _metadata_entries(capture, names, replacements, on)
        else:
            saved = _classify(diff, capture, values, rebound, aliases)
            entries.append(((capture.uses[0].line, capture.uses[0].column), saved))
    context = in_context_order(s for _, s in sorted(entries, key=lambda e: e[0]))
    _free_keywords(diff, names, replacements)
    body = diff.backward.body.visit(_Replace(replacements))
    assert isinstance(body, cst.BaseSuite)
    once = any(s.kind == "temporary" and not s.promoted for s in context)
    results = result_names(diff, names, body)
    return Lifted(
        diff,
        context,
        body,
        values,
        frozenset(names.taken),
        once,
        results,
        outputs,
        aliases,
        viewing_names(diff),
    )


def check_outputs(
    diff: Differentiator, evaluator: Evaluator, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject an output whose kind cannot be proven (S2S124), or that cannot take the
    gradient parameter a shorter backward gives it (S2S107).

    The Function must know, when it is generated, whether an output is a tensor (one
    output to autograd) or a list of tensors (flattened into its elements): guessing
    wrong would lose the gradient silently. `evaluator` holds forward's values.
    """
    final = diff.forward.body.body[-1]
    line, text = _source_line(diff, final, lines, diff.last_line)
    found = []
    for node in diff.outputs:
        value = evaluator.expr(node)
        if value.fields is not None and value.kinds == {SEQ}:
            # `x.max(dim=1)` as it is: the op would hand back a plain list of its
            # tensors (no `.values`), and backward a list of gradients.
            shown = code(node)
            fields = ", ".join(value.fields)
            found.append(
                _located(
                    "S2S124",
                    f"the output `{shown}` is a named tuple ({fields}): the op returns "
                    "tensors, and would lose its fields and give backward a list",
                    path,
                    line,
                    text,
                    shown,
                    f"return its fields as outputs of their own (`{fields} = "
                    f"{shown}`, then `return ({fields}), {diff.backward.name.value}`),"
                    f" or the one you need (`{shown}.{value.fields[0]}`)",
                )
            )
            continue
        # A tensor, maybe None or a number where it does not depend on the inputs, is
        # one output; a list of tensors is flattened; anything else may be either.
        if value.tensor_list or not (value.kinds & {SEQ, OTHER}):
            continue
        if not value.holds_tensor:
            continue
        misspelt = _misspelt(diff, evaluator, lines)
        if misspelt is not None:
            at, message, text, shown, hint = misspelt
            return [_located("S2S124", message, path, at, text, shown, hint)]
        shown = code(node)
        found.append(
            _located(
                "S2S124",
                f"cannot tell whether the output `{shown}` is a tensor or a list of "
                "tensors",
                path,
                line,
                text,
                shown,
                "bind it to a name with an annotation first "
                "(`out: torch.Tensor = ...` or `outs: list[torch.Tensor] = ...`)",
            )
        )
    return found or _check_untaken_outputs(diff, evaluator, path, line, text)


def _misspelt(
    diff: Differentiator, evaluator: Evaluator, lines: Sequence[str]
) -> tuple[int, str, str, str, str] | None:
    """Where an output's kind is unknown because forward calls a torch name that
    s2sgrad does not know but that is spelled like one it does (`torch.tahn(...)`,
    `h.tahn()`), or passes a keyword no overload of a known op takes (`t.sum(dimm=1)`):
    the first such call's line, and the message, text, shown callee and hint that
    point there, rather than at the output (the output's hint, an annotation, would
    hide the typo)."""
    for statement in diff.statements:
        line = diff.statement_lines.get(statement, diff.first_line)
        for node in nodes(statement):
            line = diff.statement_lines.get(node, line)
            if not isinstance(node, cst.Call) or not isinstance(
                node.func, cst.Attribute
            ):
                continue
            func = node.func
            name = diff.qualified_names.get(func) if dotted(func) else None
            if name is None and evaluator.expr(func.value).tensor is True:
                name = f"torch.Tensor.{func.attr.value}"
            if name is None or not name.startswith("torch."):
                continue
            text = line_text(lines, line)
            shown = code(func)
            overloads = opfacts.signatures(name)
            guess = None if overloads else opfacts.near(name)
            if guess is not None:
                right = guess.rpartition(".")[2]
                if dotted(func):
                    meant = f"{shown.rpartition('.')[0]}.{right}"
                    what = f"`{shown}` is not a function torch has"
                else:
                    meant, what = right, f"a tensor has no method `{func.attr.value}`"
                message = (
                    f"{what} (did you mean `{meant}`?): s2sgrad cannot tell what the "
                    "call returns"
                )
                return line, message, text, shown, f"write `{meant}`"
            keywords = [a.keyword.value for a in node.args if a.keyword is not None]
            unknown = [k for k in keywords if not any(o.knows({k}) for o in overloads)]
            if overloads and unknown:
                known = sorted({p.name for o in overloads for p in o.params})
                close = difflib.get_close_matches(unknown[0], known, n=1)
                message = (
                    f"no form of `{shown}` takes the keyword `{unknown[0]}`: s2sgrad "
                    "cannot tell what the call returns"
                )
                hint = f"write `{close[0]}`" if close else f"its keywords: {known}"
                return line, message, text, f"{unknown[0]}=", hint
    return None


def _check_untaken_outputs(
    diff: Differentiator, evaluator: Evaluator, path: str, line: int, text: str
) -> list[Diagnostic]:
    """Where backward takes fewer gradients than forward has outputs (S2S107): they
    go to the floating-point tensors among the outputs, in order, found at run time.
    A list of tensors is not one of those, and outputs that are never tensors take
    none, so there must be at least as many that may be."""
    n_grads, n_outputs = len(diff.grad_params), len(diff.outputs)
    if n_grads >= n_outputs:
        return []
    name, bname = diff.name, diff.backward.name.value
    hint = f"give `{bname}` one gradient parameter per output ({n_outputs})"
    values = [evaluator.expr(node) for node in diff.outputs]
    for node, value in zip(diff.outputs, values, strict=True):
        if value.tensor_list:
            shown = code(node)
            message = (
                f"`{bname}` takes fewer gradients than `{name}` has outputs, so they "
                "go to its floating-point tensor outputs in order, and the list of "
                f"tensors `{shown}` cannot take one"
            )
            return [_located("S2S107", message, path, line, text, shown, hint)]
    plain = [n for n, v in zip(diff.outputs, values, strict=True) if not v.holds_tensor]
    tensors = n_outputs - len(plain)
    if n_grads <= tensors:
        return []
    shown = code(plain[0])
    message = (
        f"`{bname}` takes {n_grads} gradients, for the floating-point tensors among "
        f"the outputs of `{name}`, but only {tensors} of its outputs may be a tensor "
        f"(`{shown}` never is)"
    )
    return [_located("S2S107", message, path, line, text, shown, hint)]


def _source_line(
    diff: Differentiator,
    statement: cst.CSTNode,
    lines: Sequence[str],
    default: int | None = None,
) -> tuple[int, str]:
    """The source line of a forward statement (or `default`, else the def line), and
    its text."""
    line = diff.statement_lines.get(statement, default or diff.first_line)
    return line, line_text(lines, line)


def _located(
    code_: str, message: str, path: str, line: int, text: str, shown: str, hint: str
) -> Diagnostic:
    """A diagnostic that points at `shown` on source line `line` (`text`), or at the
    line's first character where `shown` is not spelled there as printed. A name is
    found as a word (`n` in `return (m, n), backward` is not the one in `return`)."""
    before = r"(?<!\w)" if shown[:1].isidentifier() else ""
    after = r"(?!\w)" if shown[-1:].isalnum() or shown.endswith("_") else ""
    found = re.search(before + re.escape(shown) + after, text)
    column = found.start() + 1 if found else len(text) - len(text.lstrip()) + 1
    return Diagnostic(code_, message, path, line, column, text, hint)


#: Builtins whose argument is iterated: a parameter passed to one is a sequence.
_ITERATING = frozenset(
    {"len", "enumerate", "zip", "list", "tuple", "reversed", "sorted", "map", "sum"}
)


def check_parameters(
    diff: Differentiator, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject an unannotated parameter that takes a gradient and that the function
    uses as a sequence (S2S125).

    Without an annotation such a parameter is a tensor or a number; were it a list of
    tensors, the Function would take it as one opaque input and its elements would
    silently get no gradient.
    """
    found = []
    for param in diff.params:
        if param.node.annotation is not None or not param.gets_gradient:
            continue
        finder = _SequenceUse(param.name, diff.qualified_names)
        walk(diff.forward.body, finder)
        if finder.use is None:
            continue
        statement, shown = finder.use
        line, text = _source_line(diff, statement, lines)
        found.append(
            _located(
                "S2S125",
                f"`{param.name}` is used as a sequence (`{shown}`) but is not "
                "annotated: s2sgrad takes an unannotated parameter that gets a "
                "gradient for a tensor or a number, and the elements of a list would "
                "get no gradient",
                path,
                line,
                text,
                shown,
                f"annotate it: `{param.name}: list[torch.Tensor]` (or "
                f"`{param.name}: torch.Tensor` if it is a tensor)",
            )
        )
    return found


def check_untracked_bindings(
    diff: Differentiator, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject forward bindings that reverse mode and recomputation do not follow: an
    assignment expression (`(e := x.exp())`) and a `match` statement (S2S129). What
    they bind would be read as a constant, and higher orders would silently miss it.
    """
    found = []
    for statement in diff.statements:
        nodes = findall(statement, (cst.NamedExpr, cst.Match))
        for node in nodes[:1]:
            line, text = _source_line(diff, statement, lines)
            if isinstance(node, cst.NamedExpr):
                shown, what = f"{code(node.target)} :=", "an assignment expression"
                fix = f"bind it in a statement of its own: `{code(node.target)} = ...`"
            else:
                shown, what = "match", "a `match` statement"
                fix = "write the cases as `if`/`elif`/`else`"
            found.append(
                _located(
                    "S2S129",
                    f"forward binds values in {what}, which s2sgrad's reverse mode "
                    "does not follow: a temporary bound there would be read as a "
                    "constant",
                    path,
                    line,
                    text,
                    shown,
                    fix,
                )
            )
    return found


def check_closed_over(
    diff: Differentiator, evaluator: Evaluator, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject backward calling a function forward defines (a nested `def`, a lambda
    bound to a name) that reads a differentiable value forward computed (S2S129).

    The function travels to backward as an object, and the value it closes over
    with it: reverse mode never sees that value, so it is neither promoted nor
    recomputed, and the op's higher orders silently miss it.
    """
    captured = {c.name for c in diff.captures}
    params = {p.name for p in diff.params}
    found = []
    for statement in diff.statements:
        if isinstance(statement, cst.FunctionDef):
            if statement.name.value == diff.backward.name.value:
                continue
            name, own = statement.name.value, statement.params
            inner: cst.CSTNode = statement.body
        elif (named := _named_lambda(statement)) is not None:
            target, function = named
            name, inner, own = target.value, function.body, function.params
        else:
            continue
        if name not in captured:
            continue
        local = {p.name.value for p in (*own.params, *own.kwonly_params)} | bound(inner)
        read = sorted(
            n
            for n in spelled(inner) - local - params
            if n in evaluator.env and evaluator.env[n].diff
        )
        if not read:
            continue
        line, text = _source_line(diff, statement, lines)
        found.append(
            _located(
                "S2S129",
                f"backward calls `{name}`, a function forward defines, which reads "
                f"`{read[0]}`, a differentiable value forward computed: reverse mode "
                "does not follow what a function closes over, so higher orders would "
                f"miss `{read[0]}`",
                path,
                line,
                text,
                name,
                f"pass `{read[0]}` to `{name}` as an argument, or define `{name}` "
                "inside backward",
            )
        )
    return found


def check_detached(
    diff: Differentiator, policy: str, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject backward reading an output that torch returns without a gradient although
    it holds floating-point values (S2S128), unless the function is first-order.

    `out, mean, rstd = torch.native_layer_norm(x, ...)`: torch differentiates `out`
    with its own formula, which knows how `mean` and `rstd` depend on `x`; backward
    reading them sees constants, so its derivative (the op's second order) would miss
    their dependence on `x`, silently.
    """
    if diff.pragmas.get("policy", policy) == "first-order":
        return []
    captured = {c.name for c in diff.captures}
    found = []
    #: Names bound to a whole result with detached outputs: (op, those outputs).
    results: dict[str, tuple[str, tuple[int, ...]]] = {}
    for statement in diff.statements:
        for line_node in findall(statement, cst.SimpleStatementLine):
            for small in line_node.body:
                hit = _detached_capture(small, diff, captured, results)
                if hit is None or _only_to_backward_ops(diff.backward, hit[0]):
                    continue
                name, op = hit
                line, text = _source_line(diff, line_node, lines)
                found.append(
                    _located(
                        "S2S128",
                        f"backward reads `{name}`, an output that `{op}` returns "
                        "without a gradient: s2sgrad does not know how it depends on "
                        "the inputs, so the op's second-order gradients would miss "
                        "that dependence",
                        path,
                        line,
                        text,
                        name,
                        f"compute `{name}` with differentiable ops (`x.mean(-1, "
                        "keepdim=True)`, `torch.rsqrt(...)`), or mark the function "
                        "`# s2sgrad: policy=first-order`",
                    )
                )
    return found


def _named_lambda(statement: cst.BaseStatement) -> tuple[cst.Name, cst.Lambda] | None:
    """The name and the lambda of a line that binds one name to a lambda alone
    (`f = lambda t: t * w`), else None."""
    assign = sole(statement, cst.Assign)
    target = assigned_name(assign)
    if assign is None or target is None or not isinstance(assign.value, cst.Lambda):
        return None
    return target, assign.value


def _only_to_backward_ops(backward: cst.FunctionDef, name: str) -> bool:
    """Whether backward passes `name` only to torch's own backward operators
    (`torch.ops.aten.native_layer_norm_backward(g, x, shape, mean, rstd, ...)`), whose
    derivatives account for it."""
    uses = findall(backward.body, cst.Name, lambda n: n.value == name)
    passed = {
        id(a.value)
        for call in findall(backward.body, cst.Call)
        if code(call.func).endswith("_backward")
        for a in call.args
    }
    return bool(uses) and all(id(n) in passed for n in uses)


def _detached_capture(
    small: cst.BaseSmallStatement,
    diff: Differentiator,
    captured: set[str],
    results: dict[str, tuple[str, tuple[int, ...]]],
) -> tuple[str, str] | None:
    """(name, op) where `small` binds a captured name to a detached output of op:
    `_, mean, rstd = op(...)`, `mean = op(...)[1]`, `res = op(...)` then `res[1]`.
    Records in `results` the names that hold such a result whole."""
    if not isinstance(small, cst.Assign):
        return None
    value, index = small.value, None
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        part = value.slice[0].slice
        if isinstance(part, cst.Index) and isinstance(part.value, cst.Integer):
            index = int(part.value.value)
        elif not isinstance(part, cst.Slice):
            return None
        value = value.value
    if isinstance(value, cst.Name) and value.value in results:
        op, outputs = results[value.value]
    elif isinstance(value, cst.Call) and dotted(value.func):
        name = diff.qualified_names.get(value.func)
        if name is None or not (outputs := opfacts.detached_outputs(name)):
            return None
        op = name
    else:
        return None
    for target in small.targets:
        bound = target.target
        if isinstance(bound, cst.Name):
            if index is None:
                results[bound.value] = (op, outputs)
            if bound.value in captured and (index is None or index in outputs):
                return bound.value, op
        elif index is None and isinstance(bound, (cst.Tuple, cst.List)):
            for i, element in enumerate(bound.elements):
                item = element.value
                if i in outputs and isinstance(item, cst.Name):
                    if item.value in captured:
                        return item.value, op
    return None


#: Tensor attributes that tell a value's autograd history: inside `Function.forward`
#: (grad mode off) what forward computes has none.
_HISTORY_ATTRIBUTES = frozenset({"requires_grad", "grad_fn", "is_leaf"})


def check_autograd_state(
    diff: Differentiator, path: str, lines: Sequence[str]
) -> list[Diagnostic]:
    """Reject forward statements that read autograd's state, or set grad mode with a
    call rather than a `with` block (S2S126).

    Inside the generated Function's forward grad mode is off and the values forward
    computes have no history, where the closure ran with both: `torch.is_grad_enabled()`
    or a temporary's `.requires_grad` would silently change what backward does. A
    parameter's `.requires_grad` is the caller's tensor's, the same in both, and stays
    (unless forward rebinds the name).
    """
    params = {p.name for p in diff.params} - rebound_names(diff)
    found = []
    for statement in diff.statements:
        managers = {
            id(item.item)
            for block in findall(statement, cst.With)
            for item in block.items
        }
        setter = next(
            (
                node
                for node in findall(statement, cst.Call)
                if id(node) not in managers
                and dotted(node.func)
                and diff.qualified_names.get(node.func) in opfacts.GRAD_MODE_SETTERS
            ),
            None,
        )
        reader = next(
            (
                node
                for node in findall(statement, (cst.Call, cst.Attribute))
                if _reads_autograd_state(node, params, diff.qualified_names)
            ),
            None,
        )
        if setter is not None:
            shown = code(setter)
            message = (
                f"forward sets grad mode with a call (`{shown}`): the generated "
                "forward runs with grad mode off, and reverse mode would take the "
                "values made while it was off for differentiable ones"
            )
            hint = (
                "write those statements in a `with torch.no_grad():` block (or "
                "`with torch.set_grad_enabled(False):`), which s2sgrad follows"
            )
        elif reader is not None:
            shown = code(reader)
            message = (
                f"forward reads autograd's state (`{shown}`), which the generated "
                "forward does not share: it runs with grad mode off and its values "
                "carry no history"
            )
            hint = (
                "read `.requires_grad` of the parameters it depends on instead "
                "(`x.requires_grad`): the generated forward sees those as the "
                "closure does"
            )
        else:
            continue
        line, text = _source_line(diff, statement, lines)
        found.append(_located("S2S126", message, path, line, text, shown, hint))
    return found


def _reads_autograd_state(
    node: cst.CSTNode, params: set[str], qualified: Mapping[cst.CSTNode, str]
) -> bool:
    if isinstance(node, cst.Call):
        return (
            dotted(node.func) and qualified.get(node.func) in opfacts.GRAD_MODE_QUERIES
        )
    assert isinstance(node, cst.Attribute)
    if node.attr.value not in _HISTORY_ATTRIBUTES:
        return False
    if qualified.get(node, "").startswith("torch."):
        return False  # a torch name spelled with one of these words
    return not (isinstance(node.value, cst.Name) and node.value.value in params)


class _SequenceUse(cst.CSTVisitor):
    """Find the first use of `name` that only a sequence allows (or that iterates)."""

    def __init__(self, name: str, qualified: Mapping[cst.CSTNode, str]) -> None:
        self.name = name
        self.qualified = qualified
        self.statements: list[cst.BaseStatement] = []
        self.use: tuple[cst.BaseStatement, str] | None = None

    def _is_it(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and node.value == self.name

    def _found(self, node: cst.CSTNode) -> None:
        if self.use is None and self.statements:
            self.use = (self.statements[-1], code(node))

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseStatement):
            self.statements.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, cst.BaseStatement):
            self.statements.pop()
        super().on_leave(original_node)

    def visit_For(self, node: cst.For) -> None:
        if self._is_it(node.iter) and self.use is None:
            self.use = (node, f"for {code(node.target)} in {self.name}")

    def visit_CompFor(self, node: cst.CompFor) -> None:
        if self._is_it(node.iter):
            self._found(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        unpacked = any(
            isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets
        )
        if unpacked and self._is_it(node.value):
            self._found(node.targets[0].target)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        for i, arg in enumerate(node.args):
            if not self._is_it(arg.value):
                continue
            if arg.star == "*":
                self._found(node)
            elif isinstance(func, cst.Name) and func.value in _ITERATING:
                self._found(node)
            elif self._listed(func, i, arg):
                self._found(node)

    def _listed(self, func: cst.BaseExpression, i: int, arg: cst.Arg) -> bool:
        """Whether a torch operator takes only a list of tensors in that place."""
        qualified = self.qualified.get(func, "") if dotted(func) else ""
        if not qualified.startswith("torch.") or opfacts.variadic(qualified):
            return False
        codes = set()
        for signature in opfacts.signatures(qualified):
            params = signature.params
            if arg.keyword is not None:
                params = tuple(p for p in params if p.name == arg.keyword.value)
                i = 0
            elif any(p.keyword_only for p in params[: i + 1]):
                continue
            if i < len(params):
                codes.add(params[i].code)
        return bool(codes) and all(c.startswith("T[]") for c in codes)


def _free_keywords(
    diff: Differentiator,
    names: NameAllocator,
    replacements: dict[cst.CSTNode, cst.BaseExpression],
) -> None:
    """Keep `grad_<t>` free for the keyword parameter of each capture `t` that may be
    promoted: a backward local of that name (the closure's own `grad_a = ...`) is
    renamed, since the keyword is public and the local is not."""
    for capture in diff.captures:
        wanted = f"grad_{capture.name}"
        nodes = diff.backward_locals.get(wanted)
        if not nodes:
            continue
        renamed = cst.Name(names.fresh(wanted))
        replacements.update(dict.fromkeys(nodes, renamed))
        names.release(wanted)


def result_names(
    diff: Differentiator, names: NameAllocator, body: cst.BaseSuite | None = None
) -> tuple[str, ...]:
    """Name the variable holding each parameter's gradient in f_backward.

    Where the closure ends in `return grad_x, grad_w` with its own locals, those are the
    names (so its code reads unchanged); otherwise `grad_<parameter>`, made unique, or
    the literal `None` for a parameter that never gets a gradient. An incoming gradient
    that the closure rebinds (`grad = grad * 2; return grad`) is not a result variable:
    the result variables start at None before the closure runs.
    """
    body = diff.backward.body if body is None else body
    statements = list(body.body) if isinstance(body, cst.IndentedBlock) else []
    returns = findall(body, cst.Return)
    chosen: list[str | None] = [None] * len(diff.params)
    # The only `return` ends the body, on a line of its own.
    if (
        len(returns) == 1
        and statements
        and sole(statements[-1], cst.Return) is not None
    ):
        value = returns[0].value
        # A bare `return` counts as one item, which names nothing.
        items = (
            [e.value for e in value.elements]
            if isinstance(value, cst.Tuple)
            else [value]
        )
        assigned = bound(body)
        if len(items) == len(chosen):
            for i, item in enumerate(items):
                name = item.value if isinstance(item, cst.Name) else None
                if (
                    name in assigned
                    and name not in chosen
                    and name not in diff.grad_params
                ):
                    chosen[i] = name
    return tuple(
        c or (names.fresh(f"grad_{p.name}") if p.gets_gradient else "None")
        for c, p in zip(chosen, diff.params, strict=True)
    )


def hidden_gradient(diff: Differentiator) -> str | None:
    """How backward hides the incoming gradients from autograd, if it does: it reads
    one, or a value made from one, under `torch.no_grad()` (`inference_mode`,
    `set_grad_enabled(False)`), through `.detach()` or `.data`, or hands it to
    `torch.autograd` itself. Forward mode transposes backward by differentiating it
    in its gradients, and would answer zeros there (first order, silently)."""
    backward = diff.backward
    made = {p.name.value for p in _all_params(backward.params)}
    body = list(nodes(backward.body))
    grown = True
    while grown:
        grown = False
        for node in body:
            value: cst.BaseExpression | None = None
            targets: list[cst.BaseExpression] = []
            if isinstance(node, cst.Assign):
                value, targets = node.value, [t.target for t in node.targets]
            elif isinstance(node, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
                value, targets = node.value, [node.target]
            elif isinstance(node, cst.For):
                value, targets = node.iter, [node.target]
            if value is None or not _reads_any(value, made):
                continue
            for target in targets:
                new = bound_target(target) - made
                if new:
                    made |= new
                    grown = True
    for node in body:
        if isinstance(node, cst.With) and any(
            grad_off(item.item, diff) for item in node.items
        ):
            if _reads_any(node.body, made):
                return "reads its incoming gradient under a grad-off block"
        elif isinstance(node, cst.Attribute) and node.attr.value == "data":
            if _reads_any(node.value, made):
                return "reads its incoming gradient through `.data`"
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            name = diff.qualified_names.get(node.func) if dotted(node.func) else None
            if method in ("detach", "detach_") and _reads_any(node.func.value, made):
                return "detaches its incoming gradient"
            if (name or "").startswith("torch.autograd.") or method == "backward":
                return "calls torch.autograd itself"
    return None


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    return found + [p for p in (params.star_arg,) if isinstance(p, cst.Param)]


def _reads_any(node: cst.CSTNode, names: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in names for n in nodes(node))


def grad_off(item: cst.BaseExpression, diff: Differentiator) -> bool:
    """Whether a `with` item turns grad mode off: `torch.no_grad()`,
    `torch.inference_mode()`, `torch.set_grad_enabled(False)`."""
    if not isinstance(item, cst.Call) or not dotted(item.func):
        return False
    name = diff.qualified_names.get(item.func) or code(item.func)
    if name in ("torch.no_grad", "torch.inference_mode"):
        return True
    return (
        name == "torch.set_grad_enabled"
        and len(item.args) == 1
        and is_name(item.args[0].value, "False")
    )


#: What torch's grad-mode context managers are called, wherever torch exports them.
_GRAD_MODE_SETTERS = frozenset(
    {"no_grad", "enable_grad", "set_grad_enabled", "inference_mode"}
)


def sets_grad_mode(item: cst.BaseExpression, diff: Differentiator) -> bool:
    """Whether a `with` item sets grad mode: `torch.no_grad()`, `torch.enable_grad()`,
    `torch.set_grad_enabled(flag)`, `torch.inference_mode()`."""
    if not isinstance(item, cst.Call) or not dotted(item.func):
        return False
    name = diff.qualified_names.get(item.func) or code(item.func)
    return name.startswith("torch.") and name.rpartition(".")[2] in _GRAD_MODE_SETTERS


def viewing_names(diff: Differentiator) -> frozenset[str]:
    """The names some binding in forward may make a view of a tensor, or an existing
    object (`may_be_view`): where such a name is an output, the Function hands the
    caller a tensor of its own (`_own`), which it may change in place."""
    return _names_bound_to(diff, may_be_view)


def may_be_view(
    value: cst.BaseExpression, qualified: Mapping[cst.CSTNode, str]
) -> bool:
    """Tell whether `value` may be a view of a tensor (`h.transpose(0, 1)`, `t[0]`,
    `t.T`, `torch.einsum("ij->ji", t)`) or an object that exists already
    (`may_return_self`)."""
    if may_return_self(value, qualified):
        return True
    if isinstance(value, (cst.Subscript, cst.Attribute)):
        return True
    if isinstance(value, cst.IfExp):
        return may_be_view(value.body, qualified) or may_be_view(
            value.orelse, qualified
        )
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    name = qualified.get(func) if dotted(func) else None
    if name is None and isinstance(func, cst.Attribute):
        name = f"torch.Tensor.{func.attr.value}"
    return name is None or opfacts.may_share_memory(name)


def aliasing_names(diff: Differentiator) -> frozenset[str]:
    """The names some binding in forward may make another name's object, in one pass.

    Looks at `name = value` (also annotated, or `:=`) and at the matching element of a
    tuple assignment (`t, name = a * b, value`; unpacking a call, `name, _ = g(x)`), and
    counts a value that `may_return_self`. A name bound by `for` or `with ... as` counts
    too: nothing is known of it. Lift computes this once per differentiator (it is
    `Lifted.aliases`); the in-place judge computes it on forward before rewriting.
    """
    return _names_bound_to(diff, may_return_self)


def _names_bound_to(
    diff: Differentiator,
    test: Callable[[cst.BaseExpression, Mapping[cst.CSTNode, str]], bool],
) -> frozenset[str]:
    """The names some binding in forward gives a value that passes `test`."""
    found: set[str] = set()
    for statement in diff.statements:
        for node in findall(statement, _BINDINGS):
            for target, value in _assignments(node):
                for name, expression in _bindings(target, value):
                    if name not in found and test(expression, diff.qualified_names):
                        found.add(name)
    return frozenset(found)


def may_alias_at(
    diff: Differentiator, name: str, node: cst.CSTNode, aliases: frozenset[str]
) -> bool:
    """Tell whether `name` may hold an existing object (an input's) where forward's
    `node` runs. `aliases` (from `aliasing_names`) is the answer for the whole
    function; at a statement of forward's top level it is the binding that reaches it:
    the nearest one above, when that is a plain top-level assignment (`t = x * 2`
    makes a new tensor, even if `t = helper(t)` follows)."""
    if name not in aliases:
        return False
    top = next(
        (i for i, statement in enumerate(diff.statements) if _holds(statement, node)),
        None,
    )
    if top is None or not isinstance(diff.statements[top], cst.SimpleStatementLine):
        return True  # in a loop, a binding below may reach it too
    for statement in reversed(diff.statements[:top]):
        found = [
            expression
            for binding in findall(statement, _BINDINGS)
            for target, value in _assignments(binding)
            for bound, expression in _bindings(target, value)
            if bound == name
        ]
        if found:
            return (
                not isinstance(statement, cst.SimpleStatementLine)
                or len(found) != 1
                or may_return_self(found[0], diff.qualified_names)
            )
    return True


def _holds(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Whether `node` is `tree` or one of its descendants."""
    finder = _Finder(node)
    walk(tree, finder)
    return finder.found


class _Finder(cst.CSTVisitor):
    def __init__(self, node: cst.CSTNode) -> None:
        self.node = node
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.found = self.found or node is self.node
        return not self.found


#: The nodes that bind names (with `_assignments`).
_BINDINGS: tuple[type[cst.CSTNode], ...] = (
    cst.Assign,
    cst.AnnAssign,
    cst.NamedExpr,
    cst.For,
    cst.WithItem,
)


def _assignments(
    node: cst.CSTNode,
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(target, value) pairs of a binding; the value is the target itself when unknown."""
    if isinstance(node, cst.Assign):
        return [(t.target, node.value) for t in node.targets]
    if isinstance(node, cst.AnnAssign):
        return [(node.target, node.value)] if node.value is not None else []
    if isinstance(node, cst.NamedExpr):
        return [(node.target, node.value)]
    if isinstance(node, cst.For):
        return [(node.target, node.target)]
    if isinstance(node, cst.WithItem) and node.asname is not None:
        target = node.asname.name
        assert isinstance(target, cst.BaseExpression)
        return [(target, target)]
    return []


def may_return_self(
    value: cst.BaseExpression, qualified: Mapping[cst.CSTNode, str]
) -> bool:
    """Tell whether `value` may be an object that exists already, an input perhaps.

    A name (`x`, `x if flag else y`, `a or b`, `+x`); an op that may return its input
    (`x.contiguous()`, `x.to(dtype)`, `torch.atleast_1d(x)`: `opfacts.returns_input`)
    or writes into it (`x.mul_(2)`); a call of a module-level function, a helper or
    another differentiator, which may return its argument (`helper(x)`, `g(x)[0]`).
    """
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call):
        value = value.value
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Plus):
        return may_return_self(value.expression, qualified)  # `+x is x`
    if isinstance(value, cst.IfExp):
        return may_return_self(value.body, qualified) or may_return_self(
            value.orelse, qualified
        )
    if isinstance(value, (cst.Name, cst.BooleanOperation)):
        return True
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    name = qualified.get(func) if dotted(func) else None
    if name is not None and name.startswith("torch."):
        return opfacts.returns_input(name) or not _returns_new(name)
    if isinstance(func, cst.Name):
        return True
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method.startswith("__") and method in vars(operator):
            # `x.__neg__()` is `-x`, a new tensor; `x.__iadd__(y)` is `x += y`.
            # (`operator` has the plain `ne`, `add` too: `x.ne(y)` is the op's.)
            return method[2] == "i" and f"__{method[3:]}" in vars(operator)
        return (
            opfacts.returns_input(f"torch.Tensor.{method}")
            or opfacts.is_inplace(method)
            or not _returns_new(f"torch.Tensor.{method}")
        )
    # `torch.nn.Identity()(x)`, `(lambda a: a)(x)`: nothing is known of it.
    return True


def _returns_new(qualified: str) -> bool:
    """Whether the op table knows what `qualified` returns: tensors and values, but
    no Python object of its own making (`torch.asarray(t)` and `t.type(dtype)` may
    hand `t` back; the table says so of aten's ops only)."""
    found = opfacts.signatures(qualified)
    return bool(found) and all("o" not in s.returns for s in found)


def _bindings(
    target: cst.BaseExpression, value: cst.BaseExpression
) -> list[tuple[str, cst.BaseExpression]]:
    """(name, expression) for each name `target = value` binds, through matching tuples.

    Unpacking anything but a tuple of the same length (`t, u = g(x)`) gives each name
    the whole value: an element of it may be an existing object just as well.
    """
    if isinstance(target, cst.Name):
        return [(target.value, value)]
    if isinstance(target, cst.StarredElement):
        return _bindings(target.value, value)
    if not isinstance(target, (cst.Tuple, cst.List)):
        return []  # an item or attribute store binds no name
    if isinstance(value, (cst.Tuple, cst.List)) and len(target.elements) == len(
        value.elements
    ):
        return [
            pair
            for t, v in zip(target.elements, value.elements, strict=True)
            for pair in _bindings(t.value, v.value)
        ]
    return [
        (name, value)
        for t in target.elements
        for name, _ in _bindings(t.value, t.value)
    ]


def origin(
    diff: Differentiator, name: str, rebound: set[str]
) -> tuple[Kind, int] | None:
    """Whether `name`, when forward ends, is a Function input or output, and which."""
    params = [p.name for p in diff.params]
    if name in params and name not in rebound:
        return "input", params.index(name)
    outputs = [o.value if isinstance(o, cst.Name) else None for o in diff.outputs]
    if name in outputs:
        return "output", outputs.index(name)
    return None


def classify(
    diff: Differentiator,
    name: str,
    source: str,
    value: Value,
    where: tuple[Kind, int] | None,
    line: int,
    alias: bool,
    expression: str | None = None,
) -> Saved:
    """Make the context entry `name` for the forward value `source` (DESIGN section 2).

    `where` says whether the value is a Function input or output (`origin`); `alias`
    whether forward may have bound it to an input object; `expression` what forward
    reads for it when that is not `source` (a snapshot taken before a rebinding).
    """
    storage = storage_of(value)
    code = expression or source
    if where is not None:
        return Saved(name, source, where[0], code, storage, False, where[1], line)
    kind: Kind = "temporary" if value.diff else "constant"
    return Saved(name, source, kind, code, storage, False, None, line, alias)


def _classify(
    diff: Differentiator,
    capture: Capture,
    values: Mapping[str, Value],
    rebound: set[str],
    aliases: frozenset[str],
) -> Saved:
    name = capture.name
    params = [p.name for p in diff.params]
    # A parameter rebound on some paths only may still be the input object itself.
    alias = name in params or name in aliases
    value = values.get(name, UNKNOWN)
    where = origin(diff, name, rebound)
    return classify(diff, name, name, value, where, capture.uses[0].line, alias)


def _metadata_entries(
    capture: Capture,
    names: NameAllocator,
    replacements: dict[cst.CSTNode, cst.BaseExpression],
    on: tuple[Kind, int] | None,
) -> list[tuple[tuple[int, int], Saved]]:
    """Save each kind of metadata backward reads once, under `<name>_<kind>`."""
    entries: list[tuple[tuple[int, int], Saved]] = []
    given: dict[str, str] = {}
    for use in capture.uses:
        assert use.metadata is not None
        if use.metadata not in given:
            given[use.metadata] = names.fresh(f"{capture.name}_{use.metadata}")
            code = METADATA_CODE[use.metadata].format(capture.name)
            saved = Saved(
                given[use.metadata],
                capture.name,
                "metadata",
                code,
                "object",
                False,
                on[1] if on else None,
                use.line,
                on=on[0] if on else None,
            )
            entries.append(((use.line, use.column), saved))
        replacements[use.expression] = _metadata_read(given[use.metadata], use)
    return entries


def _metadata_read(name: str, use: Use) -> cst.BaseExpression:
    if use.index is None:
        return cst.Name(name)
    return cst.Subscript(cst.Name(name), [cst.SubscriptElement(cst.Index(use.index))])


def rebound_names(diff: Differentiator) -> set[str]:
    """Names assigned anywhere in forward's own statements."""
    return set().union(*(bound(statement) for statement in diff.statements))


class _Replace(cst.CSTTransformer):
    """Replace given original nodes (by identity) with new expressions."""

    def __init__(self, replacements: Mapping[cst.CSTNode, cst.BaseExpression]) -> None:
        self.replacements = replacements

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        return self.replacements.get(original_node, updated_node)
