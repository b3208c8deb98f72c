"""Emit the four definitions of one lifted differentiator.

Takes a `Lifted` record; returns libcst statements for `f_forward`, `f_backward`,
`FFunction` and the op `f` (DESIGN section 4). The user's own statements are moved as
nodes, so their comments and formatting survive; the fixed-shape parts are small parsed
snippets. Invariant: forward computes every value once; `setup_context` only unpacks and
saves; every saved tensor that is not promoted is marked non-differentiable.
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from s2sgrad.codegen import docs
from s2sgrad.codegen.gradients import BackwardBody, backward_body
from s2sgrad.cst import as_statement
from s2sgrad.lift import Lifted, Recompute, Saved, may_alias, may_return_self
from s2sgrad.names import NameAllocator, Names
from s2sgrad.values import param_value

#: Attributes of autograd's ctx that a saved value must not overwrite.
_CTX_API = {
    "saved_tensors",
    "needs_input_grad",
    "mark_dirty",
    "mark_non_differentiable",
    "save_for_backward",
    "set_materialize_grads",
    "materialize_grads",
    "saved_variables",
    "to_save",
    "dirty_tensors",
    "non_differentiable",
    "save_for_forward",
    "next_functions",
    "metadata",
    "name",
    "register_hook",
    "register_prehook",
    "apply",
    "apply_jvp",
}


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
    lifted: Lifted, path: str, siblings: Collection[str] = ()
) -> list[cst.BaseStatement]:
    """Emit the definitions of one differentiator.

    Calls to other differentiators of the module (`y, _ = g(x)`) become calls to their
    lifted forward, which returns `(result, ctx)` just as the closure returned
    `(result, backward)`: the module's name `g` is the op, which returns the result only.
    """
    names = Names.of(lifted.source.name)
    recompute = lifted.gradients.recompute if lifted.gradients else None
    body = backward_body(lifted)
    definitions: list[cst.BaseStatement] = [
        forward_def(lifted, names, path),
        *([recompute_def(lifted, recompute, path)] if recompute else []),
        backward_def(lifted, names, path, body),
    ]
    called = set(siblings) & set(lifted.source.globals_used)
    if called:
        rename = _SiblingCalls({s: Names.of(s) for s in called})
        definitions = [as_statement(d.visit(rename)) for d in definitions]
    return [
        *definitions,
        function_class(lifted, names, body.needs),
        op_def(lifted, names),
    ]


class _SiblingCalls(cst.CSTTransformer):
    """Point calls of sibling differentiators at their lifted pair.

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
                args=[cst.Arg(func), *updated_node.args],
            )
        return updated_node


def recompute_def(lifted: Lifted, plan: Recompute, path: str) -> cst.FunctionDef:
    """Emit the function backward calls to recompute temporaries without a VJP."""
    returned = ", ".join(plan.returns)
    ret = cst.parse_statement(f"return {returned}\n")
    doc = docs.recompute_doc(lifted, plan, path)
    params = cst.Parameters([cst.Param(cst.Name(p)) for p in plan.params])
    return cst.FunctionDef(
        name=cst.Name(plan.function),
        params=params,
        body=cst.IndentedBlock([_doc(doc), *plan.statements, ret]),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )


def forward_def(lifted: Lifted, names: Names, path: str) -> cst.FunctionDef:
    diff = lifted.source
    result = _code(diff.result)
    context = _tuple([s.expression for s in lifted.context]) if lifted.context else "()"
    ret = cst.parse_statement(f"return {result}, {context}\n")
    body = [_doc(docs.forward_doc(lifted, path)), *lifted.forward_statements, ret]
    return cst.FunctionDef(
        name=cst.Name(names.forward),
        params=diff.forward.params,
        body=cst.IndentedBlock(body),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )


def backward_def(
    lifted: Lifted, names: Names, path: str, gradients: BackwardBody
) -> cst.FunctionDef:
    diff = lifted.source
    ctx = NameAllocator(lifted.taken).fresh("ctx")
    body: list[cst.BaseStatement] = [_doc(docs.backward_doc(lifted, path))]
    if lifted.context:
        unpack = _targets([s.name for s in lifted.context])
        body.append(cst.parse_statement(f"{unpack} = {ctx}\n"))
    body += gradients.statements
    keywords = [k for _, k in lifted.gradients.incoming] if lifted.gradients else []
    if gradients.needs:
        keywords.append(gradients.needs)
    params = diff.backward.params.with_changes(
        params=[cst.Param(cst.Name(ctx)), *diff.backward.params.params],
        star_arg=cst.ParamStar() if keywords else cst.MaybeSentinel.DEFAULT,
        kwonly_params=[
            cst.Param(cst.Name(k), default=cst.Name("None")) for k in keywords
        ],
    )
    return cst.FunctionDef(
        name=cst.Name(names.backward),
        params=params,
        body=cst.IndentedBlock(body),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )


class _FunctionWriter:
    """Write the `torch.autograd.Function` subclass as source text."""

    def __init__(self, lifted: Lifted, names: Names, needs: str | None) -> None:
        self.needs = needs
        self.lifted = lifted
        self.names = names
        diff = lifted.source
        self.params = [p.name for p in diff.params]
        self.multi = diff.tuple_result
        taken = set(lifted.taken) | set(self.params)
        alloc = NameAllocator(taken)
        self.ctx = alloc.fresh("ctx")
        self.inputs = alloc.fresh("inputs")
        self.output = alloc.fresh("output")
        self.result = alloc.fresh("result")
        self.grads = self._grad_names(alloc)
        self.meta = [alloc.fresh(n) for n in ("shape", "dtype", "device")]
        self.grads_name = alloc.fresh("grads")
        self.outputs = [
            (
                o.value
                if isinstance(o, cst.Name) and o.value not in self.params
                else alloc.fresh(f"output_{i}")
            )
            for i, o in enumerate(diff.outputs)
        ]
        self.attrs = {
            s.name: (f"saved_{s.name}" if s.name in _CTX_API else s.name)
            for s in lifted.context
            if not s.tensor
        }
        # setup_context unpacks inputs and outputs side by side: an input named like an
        # output or extra (a rebound parameter) gets its own name there.
        clash = set(self.outputs) | {s.name for s in lifted.extras}
        self.input_vars = [
            alloc.fresh(f"input_{p}") if p in clash else p for p in self.params
        ]

    def _grad_names(self, alloc: NameAllocator) -> list[str]:
        grads = list(self.lifted.source.grad_params)
        incoming = dict(self.lifted.gradients.incoming) if self.lifted.gradients else {}
        alloc.taken.update(grads)
        alloc.taken.update(incoming.values())
        return grads + [
            incoming.get(s.name) or alloc.fresh(f"grad_{s.name}")
            for s in self.lifted.extras
        ]

    def write(self) -> str:
        doc = docs.docstring(docs.function_doc(self.lifted), "    ")
        parts = [
            f"class {self.names.function}(torch.autograd.Function):",
            f"    {doc}",
            "",
            "    generate_vmap_rule = True",
            "",
            *self._indent(self.forward()),
            "",
            *self._indent(self.setup_context()),
            "",
            *self._indent(self.backward()),
        ]
        return "\n".join(parts) + "\n"

    @staticmethod
    def _indent(lines: list[str]) -> list[str]:
        return [("    " + line) if line else "" for line in lines]

    def forward(self) -> list[str]:
        args = [
            f"{p.name}={p.name}" if p.keyword_only else p.name
            for p in self.lifted.source.params
        ]
        call = f"{self.names.forward}({', '.join(args)})"
        head = ["@staticmethod", f"def forward({', '.join(self.params)}):"]
        extras = self.lifted.extras
        aliased = self._aliased_outputs()
        if not extras and not aliased:
            return head + [f"    return {call}[0]"]
        # An output or extra that may be an input object itself is returned as a view:
        # autograd does not save an input returned as-is as an output.
        if self.multi:
            outs = [f"{self.result}[{i}]" for i in range(len(self.outputs))]
        else:
            outs = [self.result]
        outs = [f"{o}.view_as({o})" if i in aliased else o for i, o in enumerate(outs)]
        if self.multi and not aliased:
            outs = [f"*{self.result}"]
        returned = outs + [
            f"{s.name}.view_as({s.name})" if s.may_alias and s.tensor else s.name
            for s in extras
        ]
        why = []
        views = sum(".view_as(" in r for r in returned)
        if views:
            what = (
                "A view, in case it is an input"
                if views == 1
                else "Views, in case of inputs"
            )
            why = [f"    # {what}: autograd cannot save an input returned as is."]
        if not extras:
            return head + [
                f"    {self.result} = {call}[0]",
                *why,
                f"    return {', '.join(returned)}",
            ]
        targets = [s.name if s in extras else "_" for s in self.lifted.context]
        return head + [
            f"    {self.result}, {_tuple(targets)} = {call}",
            *why,
            f"    return {', '.join(returned)}",
        ]

    def _aliased_outputs(self) -> set[int]:
        """Outputs that may be an input object: a parameter, `z = x`, `x.contiguous()`.

        A parameter counts even when forward rebinds it: on a path that skips the
        rebinding (`if flag: x = x * 2.0`) it is still the input object.
        """
        diff = self.lifted.source
        params = {p.name for p in diff.params}
        found = set()
        for i, output in enumerate(diff.outputs):
            if isinstance(output, cst.Name):
                if output.value in params or may_alias(diff, output.value):
                    found.add(i)
            elif may_return_self(output):  # written in the return: `x.contiguous()`
                found.add(i)
        return found

    def _value(self, saved: Saved) -> str:
        """Return the setup_context expression for one context entry."""
        if saved.kind == "output" and not self.multi and not self.lifted.extras:
            return self.output
        if saved.kind == "output":
            assert saved.index is not None
            return self.outputs[saved.index]
        if saved.kind == "input":
            assert saved.index is not None
            return self.input_vars[saved.index]
        return saved.name

    def setup_context(self) -> list[str]:
        lines = [
            "@staticmethod",
            f"def setup_context({self.ctx}, {self.inputs}, {self.output}):",
        ]
        context = self.lifted.context
        wanted = {
            self.params[s.index]
            for s in context
            if s.kind == "input" and s.index is not None
        }
        if wanted:
            targets = [
                v if p in wanted else "_"
                for p, v in zip(self.params, self.input_vars, strict=True)
            ]
            lines.append(f"    {_targets(targets)} = {self.inputs}")
        if self.multi or self.lifted.extras:
            needed = {s.index for s in context if s.kind == "output"}
            outs = [
                o if i in needed or self.multi else "_"
                for i, o in enumerate(self.outputs)
            ]
            targets = outs + [s.name for s in self.lifted.extras]
            lines.append(f"    {_targets(targets)} = {self.output}")
        frozen = [s.name for s in self.lifted.extras if s.tensor and not s.promoted]
        if frozen:
            lines.append(f"    {self.ctx}.mark_non_differentiable({', '.join(frozen)})")
        tensors = [self._value(s) for s in context if s.tensor]
        if tensors:
            lines.append(f"    {self.ctx}.save_for_backward({', '.join(tensors)})")
        for saved in context:
            if not saved.tensor:
                lines.append(
                    f"    {self.ctx}.{self.attrs[saved.name]} = {self._value(saved)}"
                )
        if self.multi:
            for out in self.outputs:
                lines.append(
                    f"    {self.ctx}.{out}_like = {out}.shape, {out}.dtype, {out}.device"
                )
        lines.append(f"    {self.ctx}.set_materialize_grads(False)")
        return lines

    def backward(self) -> list[str]:
        lines = ["@staticmethod"]
        if self.lifted.once_differentiable:
            lines.append("@once_differentiable")
        lines.append(f"def backward({self.ctx}, {', '.join(self.grads)}):")
        n_params = len(self.params)
        nones = ", ".join(["None"] * n_params) + ("," if n_params == 1 else "")
        user = self.lifted.source.grad_params
        incoming = (
            [k for _, k in self.lifted.gradients.incoming]
            if self.lifted.gradients
            else []
        )
        if incoming:
            # Under torch.compile the unused extra outputs get zero gradients, not None,
            # and inductor would keep their VJPs; compile has no double backward, the
            # only source of these gradients, so they are dropped there.
            lines += [
                "    if torch.compiler.is_compiling():",
                "        # Only a double backward sends these, and torch.compile has none.",
                f"        {' = '.join(incoming)} = None",
            ]
        none_test = " and ".join(f"{g} is None" for g in (*user, *incoming))
        lines += [f"    if {none_test}:", f"        return {nones}"]
        if self.multi:
            indent = "    "
            if incoming:
                any_test = " or ".join(f"{g} is not None" for g in user)
                lines.append(f"    if {any_test}:")
                indent = "        "
            for grad, out in zip(user, self.outputs, strict=True):
                lines += [
                    f"{indent}if {grad} is None:",
                    f"{indent}    {', '.join(self.meta)} = {self.ctx}.{out}_like",
                    f"{indent}    {grad} = torch.zeros({self.meta[0]}, dtype={self.meta[1]}, "
                    f"device={self.meta[2]})",
                ]
        tensors = [s.name for s in self.lifted.context if s.tensor]
        if tensors:
            lines.append(f"    {_targets(tensors)} = {self.ctx}.saved_tensors")
        ctx_items = [
            s.name if s.tensor else f"{self.ctx}.{self.attrs[s.name]}"
            for s in self.lifted.context
        ]
        ctx_value = _tuple(ctx_items) if ctx_items else "()"
        keywords = [f"{k}={k}" for k in incoming]
        if self.needs:
            keywords.append(f"{self.needs}={self.ctx}.needs_input_grad")
        call = f"{self.names.backward}({', '.join([ctx_value, *user, *keywords])})"
        lines += self._return(call, nones)
        return lines

    def _return(self, call: str, nones: str) -> list[str]:
        """Return gradients, with None for inputs that cannot take one."""
        diff = self.lifted.source
        kinds = [
            param_value(p).tensor if p.gets_gradient else True for p in diff.params
        ]
        fixed = [i for i, tensor in enumerate(kinds) if tensor is False]
        maybe = [i for i, tensor in enumerate(kinds) if tensor is None]
        bare_none = diff.returns_bare_none and len(self.params) > 1
        if not fixed and not maybe and not bare_none:
            return [f"    return {call}"]
        grads = self.grads_name
        lines = [f"    {grads} = {call}"]
        if bare_none:
            lines += [f"    if {grads} is None:", f"        return {nones}"]
        if fixed or maybe:
            # A number where a tensor may be passed takes no gradient: autograd wants
            # None there, and needs_input_grad says which it was.
            items = [
                (
                    "None"
                    if i in fixed
                    else (
                        f"{grads}[{i}] if {self.ctx}.needs_input_grad[{i}] else None"
                        if i in maybe
                        else f"{grads}[{i}]"
                    )
                )
                for i in range(len(self.params))
            ]
            lines.append(f"    return {', '.join(items)}")
        else:
            lines.append(f"    return {grads}")
        return lines


def function_class(
    lifted: Lifted, names: Names, needs: str | None
) -> cst.BaseStatement:
    text = _FunctionWriter(lifted, names, needs).write()
    statement = cst.parse_module(text).body[0]
    return statement.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])


def op_def(lifted: Lifted, names: Names) -> cst.FunctionDef:
    diff = lifted.source
    args = ", ".join(p.name for p in diff.params)
    call = f"{names.function}.apply({args})"
    if lifted.extras:
        call += f"[:{len(diff.outputs)}]" if diff.tuple_result else "[0]"
    body = [_doc(docs.op_doc(lifted)), cst.parse_statement(f"return {call}\n")]
    return cst.FunctionDef(
        name=cst.Name(names.op),
        params=diff.forward.params,
        body=cst.IndentedBlock(body),
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()],
    )
