"""Emit the four definitions of one differentiator.

Takes a `Differentiated` record; returns libcst statements for `f_forward`, `f_backward`,
`FFunction` and the op `f` (DESIGN section 4). The user's own statements are moved as
nodes, so their comments and formatting survive; the fixed-shape parts are small parsed
snippets. Invariant: forward computes every value once; `setup_context` only unpacks and
saves; every saved tensor that is not promoted is marked non-differentiable.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import libcst as cst

from s2sgrad.autodiff.inline import names_read
from s2sgrad.autodiff.record import Differentiated, Recompute
from s2sgrad.codegen import docs, types
from s2sgrad.codegen.function import function_class, op_def
from s2sgrad.codegen.gradients import BackwardBody, backward_body
from s2sgrad.cst import (
    DepthTransformer,
    LineDropper,
    as_statement,
    bound,
    bound_target,
    nodes,
)
from s2sgrad.frontend.model import Differentiator
from s2sgrad.lift import sets_grad_mode
from s2sgrad.names import NameAllocator, Names
from s2sgrad.options import Compile
from s2sgrad.values import writes

#: The runtime's reading of a parameter's `.requires_grad` in forward.
REQUIRES_GRAD = "_requires_grad"
#: The runtime's context manager that sets forward-mode tangents as grad mode is.
TANGENTS = "_tangents_follow_grad"


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _doc(text: str, indent: str = "    ") -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(
        [cst.Expr(cst.SimpleString(docs.docstring(text, indent)))]
    )


def _tuple(items: list[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return f"({', '.join(items)})"


def _targets(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else ", ".join(items)


def emit(
    record: Differentiated,
    path: str,
    siblings: Collection[str] = (),
    module_names: Collection[str] = (),
    line_length: int = 88,
    compiled: Compile = False,
    literals: frozenset[str] = frozenset(),
    closure_called: bool = False,
) -> list[cst.BaseStatement | str]:
    """Emit the definitions of one differentiator (`closure_called`: another's
    backward calls its closure): statements, and the Function class as code.

    Calls to other differentiators of the module (`y, _ = g(x)`) become calls to their
    record forward, which returns `(result, ctx)` just as the closure returned
    `(result, backward)`: the module's name `g` is the op, which returns the result only.
    """
    names = Names.of(record.source.name)
    recompute = record.gradients.recompute if record.gradients else None
    body = backward_body(record, line_length, closure_called)
    definitions: list[cst.BaseStatement] = [
        forward_def(record, names, path),
        *([recompute_def(record, recompute, path)] if recompute else []),
        backward_def(record, names, path, body),
    ]
    # Backward runs these; forward too where another backward calls its closure.
    if any(type(n) is cst.With for n in nodes(record.source.forward)):
        stopped = _TangentsStopped(record.source)
        first = 0 if closure_called else 1
        definitions[first:] = [
            as_statement(d.visit(stopped)) for d in definitions[first:]
        ]
    called = set(siblings) & set(record.source.globals_used)
    if called:
        rename = _SiblingCalls({s: Names.of(s) for s in called})
        definitions = [as_statement(d.visit(rename)) for d in definitions]
    if _defines_helpers(record.source.forward):
        definitions = [as_statement(d.visit(_TypedHelpers())) for d in definitions]
    pair = (names.forward, names.backward)
    if compiled:
        strict = ", strict=True" if compiled == "strict" else ""
        # The Function calls the pair through compiled wrappers (the runtime's
        # `_compiled`), whose names never start with `__`.
        alias = NameAllocator({*module_names, *record.taken})
        pair = (
            alias.fresh(f"compiled_{names.forward.lstrip('_')}"),
            alias.fresh(f"compiled_{names.backward.lstrip('_')}"),
        )
        definitions += [
            cst.parse_statement(
                f"{pair[0]} = _compiled({names.forward}{strict})\n"
            ).with_changes(
                leading_lines=[
                    cst.EmptyLine(),
                    cst.EmptyLine(),
                    cst.EmptyLine(
                        comment=cst.Comment(
                            "# compile=true: inductor runs these where it can (`_compiled` above)."
                        )
                    ),
                ]
            ),
            cst.parse_statement(
                f"{pair[1]} = _compiled({names.backward}, differentiable=True{strict})\n"
            ),
        ]
    elif names.forward.startswith("__") or {*pair} & record.taken:
        # Python mangles `__name` inside a class body, and a name the closure binds
        # itself (`f_forward = torch.exp(x)`) would be a local of the Function's
        # methods: the Function calls the pair through other names.
        alias = NameAllocator({*module_names, *record.taken})
        pair = (alias.fresh(names.forward[1:]), alias.fresh(names.backward[1:]))
        why = (
            "Python would mangle these names inside the class body."
            if names.forward.startswith("__")
            else f"`{record.source.name}` binds these names itself: its Function calls"
            " the pair by these."
        )
        if not names.forward.startswith("__"):
            pair = (alias.fresh(names.forward), alias.fresh(names.backward))
        definitions.append(
            cst.parse_statement(
                f"{pair[0]}, {pair[1]} = {names.forward}, {names.backward}\n"
            ).with_changes(
                leading_lines=[
                    cst.EmptyLine(),
                    cst.EmptyLine(),
                    cst.EmptyLine(comment=cst.Comment(f"# {why}")),
                ]
            )
        )
    return [
        *definitions,
        function_class(
            record, names, body.needs, pair, body.handles_none, literals, line_length
        ),
        op_def(record, names, path, literals),
    ]


class _KeptAlive(LineDropper):
    """Forward's statements without `del name` of a name the function returns: the
    closure dropped a temporary it no longer needed (`t = tmp * 1.0; del tmp`),
    but the generated function hands it to backward, which reads it (an outside
    probe: UnboundLocalError at every call). Unbinding a name changes no value the
    code computes; the temporary lives as long as backward needs it, as in the
    closure's own saved graph."""

    def __init__(self, returned: set[str]) -> None:
        super().__init__()
        self.returned = returned

    @classmethod
    def apply(
        cls, statements: Sequence[cst.BaseStatement], returned: set[str]
    ) -> list[cst.BaseStatement]:
        """`statements` without those `del`s."""
        if not any(isinstance(n, cst.Del) for s in statements for n in nodes(s)):
            return list(statements)
        return cls(returned).run(statements)

    def leave_SimpleStatementLine(
        self,
        original_node: cst.SimpleStatementLine,
        updated_node: cst.SimpleStatementLine,
    ) -> cst.SimpleStatementLine:
        body = [s for s in updated_node.body if not self._unbinds_returned(s)]
        if len(body) == len(updated_node.body):
            return updated_node
        if not body:
            return self.emptied_line(updated_node)
        last = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(body=[*body[:-1], last])

    def _unbinds_returned(self, statement: cst.BaseSmallStatement) -> bool:
        return isinstance(statement, cst.Del) and bool(
            bound_target(statement.target) & self.returned
        )


class _TangentsStopped(cst.CSTTransformer):
    """A block of code backward runs that sets grad mode (`with torch.no_grad():`,
    `set_grad_enabled(flag)`, `enable_grad()`), with the runtime's
    `_tangents_follow_grad()` beside it. Reverse mode reads what a grad-off block
    computes as a constant; forward mode through backward (a Hessian by
    `jacfwd(jacrev(f))`, the `jvp` of a gradient) would give it a tangent, which
    `torch.no_grad()` does not stop, and answer another second derivative."""

    def __init__(self, diff: Differentiator) -> None:
        self.diff = diff

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        if not any(
            sets_grad_mode(item.item, self.diff) for item in original_node.items
        ):
            return updated_node
        *items, last = updated_node.items
        stop = cst.WithItem(cst.Call(cst.Name(TANGENTS)))
        return updated_node.with_changes(
            items=[*items, last.with_changes(comma=cst.Comma(_SPACE)), stop]
        )


_SPACE = cst.SimpleWhitespace(" ")


class _RequiresGrad(cst.CSTTransformer):
    """`p.requires_grad` of a parameter as `_requires_grad(p)` (runtime): inside the
    Function under torch.func transforms and forward mode, an input that is being
    differentiated does not say so itself."""

    def __init__(self, params: set[str]) -> None:
        self.params = params

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        value = updated_node.value
        if (
            updated_node.attr.value == "requires_grad"
            and isinstance(value, cst.Name)
            and value.value in self.params
        ):
            return cst.Call(cst.Name(REQUIRES_GRAD), [cst.Arg(value)])
        return updated_node


def _rebound(backward: cst.FunctionDef) -> set[str]:
    """Names backward binds itself (its parameters too): no longer forward's."""
    return bound(backward.body) | {p.name.value for p in backward.params.params}


class _SiblingCalls(cst.CSTTransformer):
    """Point calls of sibling differentiators at their record pair.

    `g(...)` becomes `g_forward(...)`, and a call of its closure in backward,
    `g(...)[1](grad)` (the only use of it the frontend accepts), becomes
    `g_backward(g_forward(...)[1], grad)`.
    """

    def __init__(self, siblings: dict[str, Names]) -> None:
        self.siblings = siblings
        self.backwards = {n.forward: n.backward for n in siblings.values()}

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = updated_node.func
        if isinstance(func, cst.Name) and func.value in self.siblings:
            forward = self.siblings[func.value].forward
            return updated_node.with_changes(func=cst.Name(forward))
        if (
            isinstance(func, cst.Subscript)
            and isinstance(func.value, cst.Call)
            and isinstance(func.value.func, cst.Name)
            and func.value.func.value in self.backwards
        ):
            backward = self.backwards[func.value.func.value]
            return updated_node.with_changes(
                func=cst.Name(backward),
                args=[cst.Arg(func), *(self._typed(a) for a in updated_node.args)],
            )
        return updated_node

    def _typed(self, arg: cst.Arg) -> cst.Arg:
        """A gradient that is what another closure's backward returned
        (`lin_bwd(act_bwd(g))`) as a `Tensor`: the backward returns `Grad`, None
        standing for zeros, where the one it is handed to may take a tensor only;
        the closure hands it over as it is, and so does this call."""
        value = arg.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in self.backwards.values()
        ):
            typed = cst.Call(
                cst.Name("cast"), [cst.Arg(cst.Name("Tensor")), cst.Arg(value)]
            )
            return arg.with_changes(value=typed)
        return arg


def recompute_def(
    record: Differentiated, plan: Recompute, path: str
) -> cst.FunctionDef:
    """Emit the function backward calls to recompute temporaries without a VJP."""
    returned = ", ".join(plan.returns)
    ret = cst.parse_statement(f"return {returned}\n")
    doc = docs.recompute_doc(record, plan.returns, path)
    params = cst.Parameters(
        [
            cst.Param(cst.Name(p), cst.Annotation(cst.parse_expression(t)))
            for p, t in zip(plan.params, _recompute_types(record, plan), strict=True)
        ]
    )
    read = names_read(ret)
    kept = _KeptAlive.apply(_blocks_trimmed(plan.statements, read), read)
    return cst.FunctionDef(
        name=cst.Name(plan.function),
        params=params,
        body=cst.IndentedBlock([_doc(doc), *kept, ret]),
        returns=cst.Annotation(cst.parse_expression("Any")),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )


def _defines_helpers(forward: cst.FunctionDef) -> bool:
    """Whether the user's forward or backward define a function of their own: a
    lambda, or a `def` besides backward (the source's nodes are walked once a
    conversion; the generated ones would be walked again)."""
    defs = 0
    for node in nodes(forward)[1:]:
        kind = type(node)  # leaf classes: no ABCMeta `isinstance`
        if kind is cst.Lambda:
            return True
        defs += kind is cst.FunctionDef
    return defs > 1


class _TypedHelpers(DepthTransformer):
    """Type the functions the user's code defines inside the generated ones, as
    mypy --strict wants them: an unannotated parameter or return is `Any` (the
    nested closure backward keeps is typed so already), and `act = lambda v: ...`,
    which no annotation reaches (and ruff's E731 flags), is written as the `def` it
    stands for."""

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        updated_node = super().leave_FunctionDef(original_node, updated_node)
        if self.depth == 0:
            return updated_node
        return updated_node.with_changes(
            params=_any_params(updated_node.params),
            returns=updated_node.returns or cst.Annotation(cst.Name("Any")),
        )

    def leave_SimpleStatementLine(
        self,
        original_node: cst.SimpleStatementLine,
        updated_node: cst.SimpleStatementLine,
    ) -> cst.BaseStatement:
        if self.depth == 0 or len(updated_node.body) != 1:
            return updated_node
        small = updated_node.body[0]
        if not (
            isinstance(small, cst.Assign)
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and isinstance(small.value, cst.Lambda)
        ):
            return updated_node
        return cst.FunctionDef(
            name=small.targets[0].target,
            params=_any_params(small.value.params),
            body=cst.IndentedBlock(
                [cst.SimpleStatementLine([cst.Return(small.value.body)])]
            ),
            returns=cst.Annotation(cst.Name("Any")),
            leading_lines=updated_node.leading_lines,
        )


def _any_params(params: cst.Parameters) -> cst.Parameters:
    """`params`, each without an annotation annotated `Any`."""

    def typed(param: cst.Param) -> cst.Param:
        if param.annotation is not None:
            return param
        return param.with_changes(
            annotation=cst.Annotation(cst.Name("Any")),
            whitespace_after_param=cst.SimpleWhitespace(""),
        )

    star_arg = params.star_arg
    return params.with_changes(
        posonly_params=[typed(p) for p in params.posonly_params],
        params=[typed(p) for p in params.params],
        kwonly_params=[typed(p) for p in params.kwonly_params],
        star_arg=typed(star_arg) if isinstance(star_arg, cst.Param) else star_arg,
        star_kwarg=typed(params.star_kwarg) if params.star_kwarg else None,
    )


def _blocks_trimmed(
    statements: Sequence[cst.BaseStatement], live: set[str]
) -> list[cst.BaseStatement]:
    """`statements`, each `with` block (`with torch.no_grad():`, which recomputation
    keeps whole) without the assignments nothing after it reads: `m = ...` beside
    the `s = ...` backward recomputes was a name assigned and never read. Only an
    assignment of a value whose calls change nothing goes (no `x.add_(...)`)."""
    kept: list[cst.BaseStatement] = []
    for statement in reversed(statements):
        if isinstance(statement, cst.With) and isinstance(
            statement.body, cst.IndentedBlock
        ):
            body = _dead_dropped(list(statement.body.body), set(live))
            block = body or [cst.SimpleStatementLine([cst.Pass()])]
            statement = statement.with_changes(
                body=statement.body.with_changes(body=block)
            )
        live = live | names_read(statement)
        kept.append(statement)
    return kept[::-1]


def _dead_dropped(
    statements: list[cst.BaseStatement], live: set[str]
) -> list[cst.BaseStatement]:
    kept: list[cst.BaseStatement] = []
    for statement in reversed(statements):
        targets = _assigned(statement)
        if targets and not targets & live and not _changes_something(statement):
            continue
        live = live | names_read(statement)
        kept.append(statement)
    return kept[::-1]


def _changes_something(statement: cst.CSTNode) -> bool:
    """Whether a call in `statement` may change its arguments or its receiver: an
    in-place method (`add_`), or any call of a plain name (a helper)."""
    for node in nodes(statement):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and not func.attr.value.endswith("_"):
            continue
        if isinstance(func, cst.Name) and func.value in _PURE_BUILTINS:
            continue
        return True
    return False


_PURE_BUILTINS = frozenset({"float", "int", "len", "max", "min", "abs", "bool"})


def _recompute_types(record: Differentiated, plan: Recompute) -> list[str]:
    by_name = {s.name: s for s in record.context}
    found = []
    for arg in plan.args:
        saved = by_name.get(arg)
        found.append(
            types.TENSOR if saved is not None and saved.storage == "tensor" else "Any"
        )
    return found


def forward_def(record: Differentiated, names: Names, path: str) -> cst.FunctionDef:
    diff = record.source
    result = _code(diff.result)
    context = _tuple([s.expression for s in record.context]) if record.context else "()"
    ret = cst.parse_statement(f"return {result}, {context}\n")
    flags = _RequiresGrad({p.name for p in diff.params})
    recompute = record.gradients.recompute if record.gradients else None
    statements = _KeptAlive.apply(
        [
            as_statement(s.visit(flags))
            for s in _live(record.forward_statements, ret, recompute)
        ],
        names_read(ret),
    )
    body = [_doc(docs.forward_doc(record, path)), *statements, ret]
    returns = types.of_result(record.outputs, diff.tuple_result)
    function = cst.FunctionDef(
        name=cst.Name(names.forward),
        params=types.annotated(diff.forward.params, diff.params),
        body=cst.IndentedBlock(body),
        returns=cst.Annotation(
            cst.parse_expression(f"tuple[{returns}, {types.CONTEXT}]")
        ),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )
    ints = frozenset(p.name for p in diff.params if p.annotation == "int")
    return types.numbers_widened(function, ints)


def _live(
    statements: Sequence[cst.BaseStatement],
    ret: cst.BaseStatement,
    recompute: Recompute | None,
) -> list[cst.BaseStatement]:
    """Forward's statements without those that only computed a value backward now
    recomputes: an assignment to names nothing after it reads (neither the result nor
    the context), which is one of the statements `f_recompute` runs. s2sgrad runs
    those again in backward, so running them here as well was dead work (and a name
    assigned and never read)."""
    if recompute is None:
        return list(statements)
    replayed: list[cst.BaseStatement] = [
        n
        for r in recompute.statements
        for n in nodes(r)
        if isinstance(n, cst.SimpleStatementLine)
    ]
    # A loop `f_recompute` runs whole (`for i in range(2): c = ...`) is dead work in
    # forward too where nothing after it reads what it binds or changes.
    replayed += [r for r in recompute.statements if isinstance(r, (cst.For, cst.While))]
    return _live_in(statements, names_read(ret), replayed)


def _live_in(
    statements: Sequence[cst.BaseStatement],
    live: set[str],
    replayed: Sequence[cst.BaseStatement],
) -> list[cst.BaseStatement]:
    """`_live` of a block whose successors read `live`; inside an `if`, each branch
    too (`slope = 1 - t * t` under `if act == "tanh":`), a branch left empty being
    `pass`. A loop's body is kept whole: the next iteration may read it."""
    kept: list[cst.BaseStatement] = []
    for statement in reversed(statements):
        targets = _assigned(statement)
        if isinstance(statement, (cst.For, cst.While)):
            targets = writes(statement)  # its changes count: `acc.append(c)`
        if (
            targets
            and not targets & live
            and any(statement.deep_equals(r) for r in replayed)
        ):
            continue
        if isinstance(statement, cst.If):
            statement = _live_branches(statement, live, replayed)
        live = live | names_read(statement)
        kept.append(statement)
    return kept[::-1]


def _live_branches(
    node: cst.If, live: set[str], replayed: Sequence[cst.BaseStatement]
) -> cst.If:
    def block(suite: cst.BaseSuite) -> cst.BaseSuite:
        if not isinstance(suite, cst.IndentedBlock):
            return suite
        body = _live_in(list(suite.body), set(live), replayed)
        if not body:
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return suite.with_changes(body=body)

    orelse = node.orelse
    if isinstance(orelse, cst.If):
        orelse = _live_branches(orelse, live, replayed)
    elif isinstance(orelse, cst.Else):
        orelse = orelse.with_changes(body=block(orelse.body))
    return node.with_changes(body=block(node.body), orelse=orelse)


def _assigned(statement: cst.BaseStatement) -> set[str]:
    """The names `name = ...` (or `a = b = ...`) binds; empty for any other form."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return set()
    small = statement.body[0]
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        names = [small.target]
    elif isinstance(small, cst.Assign):
        names = [t.target for t in small.targets]
    else:
        return set()
    if not all(isinstance(n, cst.Name) for n in names):
        return set()
    return {n.value for n in names if isinstance(n, cst.Name)}


def backward_def(
    record: Differentiated, names: Names, path: str, gradients: BackwardBody
) -> cst.FunctionDef:
    diff = record.source
    ctx = NameAllocator(record.taken).fresh("ctx")
    incoming = [k for _, k in record.gradients.incoming] if record.gradients else []
    promoted = [t for t, _ in record.gradients.incoming] if record.gradients else []
    body: list[cst.BaseStatement] = [_doc(docs.backward_doc(record, path, promoted))]
    if record.context:
        unpack = _targets([s.name for s in record.context])
        body.append(cst.parse_statement(f"{unpack} = {ctx}\n"))
    # `x.requires_grad` read in backward, as in forward: forward mode runs backward's
    # transpose, where an input being differentiated does not say so itself.
    flags = _RequiresGrad({p.name for p in diff.params} - _rebound(diff.backward))
    body += [as_statement(s.visit(flags)) for s in gradients.statements]
    keywords = [(k, types.GRAD) for k in incoming]
    if gradients.needs:
        keywords.append((gradients.needs, types.NEEDS))
    grad_type = types.GRAD if gradients.handles_none else types.TENSOR
    listed = {i for i, value in enumerate(record.outputs) if value.tensor_list}
    params = [cst.Param(cst.Name(ctx), _annotation(types.CONTEXT))]
    #: An output that may not be a tensor (`n = x.shape[0]`) gets no zeros: its
    #: gradient may stay None.
    maybe = {i for i, value in enumerate(record.outputs) if value.tensor is not True}
    if len(diff.backward.params.params) == 1:
        # The Function returns early where its one gradient is None.
        maybe = set()
    if len(diff.grad_params) < len(record.outputs):
        # The gradients of the floating-point tensors among the outputs, found at run
        # time (zeros where none came): a tensor each.
        listed = maybe = set()
    for i, param in enumerate(diff.backward.params.params):
        kind = f"list[{types.TENSOR}]" if i in listed else grad_type
        if i in maybe - listed:
            kind = types.GRAD
        params.append(param.with_changes(annotation=_annotation(kind), default=None))
    return types.numbers_widened(
        cst.FunctionDef(
            name=cst.Name(names.backward),
            params=diff.backward.params.with_changes(
                params=params,
                star_arg=cst.ParamStar() if keywords else cst.MaybeSentinel.DEFAULT,
                kwonly_params=[
                    cst.Param(cst.Name(k), _annotation(t), default=cst.Name("None"))
                    for k, t in keywords
                ],
            ),
            body=cst.IndentedBlock(body),
            returns=_annotation(gradients.returns),
            leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
        )
    )


def _annotation(text: str) -> cst.Annotation:
    return cst.Annotation(cst.parse_expression(text))
