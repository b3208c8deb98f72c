"""Generate vector-Jacobian code for the forward statements behind promoted temporaries.

Takes the versioned forward program, the versions whose gradients arrive from outside
(promoted temporaries) and the rule registry; returns reverse-mode statements that add
each arriving gradient into the accumulators of the values it was computed from, down to
the inputs. Forward values the code reads are written as placeholders naming a version;
`resolve` (in `plan.py`) decides how backward reads each one (by name, through a saved
metadata value, or through a snapshot taken in forward). Invariant: each block runs only
when its incoming gradient is not None, and every contribution is added None-aware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.autodiff.inline import inline, parenthesize, rule_reads, settled
from s2sgrad.autodiff.program import Assign, Branch, Opaque, Program, Step, Version
from s2sgrad.autodiff.registry import Registry, Rule
from s2sgrad.autodiff.shapes import ShapeFacts, class_of
from s2sgrad.cst import NameRewriter, as_expression, calls_name, dotted, nodes, spelled
from s2sgrad.frontend.model import (
    METADATA_ATTRIBUTES,
    METADATA_METHODS,
    Differentiator,
)
from s2sgrad.names import NameAllocator
from s2sgrad.values import (
    NONE,
    NUMBER,
    OTHER,
    SCALAR,
    SEQ,
    SETITEM,
    TENSOR,
    UNKNOWN,
    Evaluator,
    ModuleFacts,
    Value,
)

PLACEHOLDER = "__s2sgrad_v{}__"
ACCUMULATE = "_accumulate"
#: `_reduce(grad, shape)`: a gradient that may be unreduced or None, summed to `shape`.
REDUCE = "_reduce"

_OPERATORS: dict[type[cst.BaseBinaryOp], str] = {
    cst.Add: "operator.add",
    cst.Subtract: "operator.sub",
    cst.Multiply: "operator.mul",
    cst.Divide: "operator.truediv",
    cst.Power: "operator.pow",
    cst.MatrixMultiply: "operator.matmul",
}


class NoRule(Exception):
    """A forward statement reverse mode cannot differentiate, with the reason."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


def placeholder(version: Version) -> cst.Name:
    return cst.Name(PLACEHOLDER.format(version.id))


def placeholder_version(node: cst.CSTNode) -> int | None:
    """Return the version id a placeholder name stands for, or None."""
    if isinstance(node, cst.Name) and node.value.startswith("__s2sgrad_v"):
        return int(node.value[len("__s2sgrad_v") : -2])
    return None


class _Placeholders(NameRewriter):
    """Replace reads of forward names with placeholders of the versions live there."""

    def __init__(
        self,
        env: Mapping[str, Version],
        hoisted: Mapping[cst.CSTNode, Version] | None = None,
    ) -> None:
        self.env = env
        self.hoisted = hoisted or {}

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
        version = self.hoisted.get(original_node)
        if version is not None:
            return placeholder(version)
        return super().on_leave(original_node, updated_node)  # type: ignore[return-value]

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def rewrite(self, name: str) -> cst.BaseExpression | None:
        version = self.env.get(name)
        return None if version is None else placeholder(version)


def slice_of(program: Program, roots: set[int]) -> set[int]:
    """Return the versions whose gradients matter for the `roots`, or raise NoRule."""
    needed = set(roots)
    _slice(program.steps, needed)
    return needed


def _slice(steps: list[Step], needed: set[int]) -> None:
    for step in reversed(steps):
        if isinstance(step, Assign) and step.target.id in needed:
            needed |= {v.id for v in _diff_reads(step.value, step.before)}
        elif isinstance(step, Branch):
            for merged, a, b in step.merges:
                if merged.id in needed:
                    needed |= {v.id for v in (a, b) if v is not None and v.value.diff}
                    if a is None or b is None:
                        prior = step.before.get(merged.name)
                        if prior is not None:
                            needed.add(prior.id)
            _slice(step.body, needed)
            _slice(step.orelse, needed)
        elif isinstance(step, Opaque):
            hit = [v for v in step.created if v.id in needed]
            if hit:
                raise NoRule(step.line, f"`{hit[0].name}` comes from {step.reason}")


def _diff_reads(node: cst.BaseExpression, env: Mapping[str, Version]) -> list[Version]:
    found = []
    for name in sorted(spelled(node)):
        version = env.get(name)
        if version is not None and version.value.diff:
            found.append(version)
    return found


@dataclass(frozen=True)
class Sibling:
    """Another differentiator of the module: its own lifted pair is the rule for it."""

    name: str
    params: tuple[str, ...]
    forward: str
    backward: str
    #: Its backward returns a bare gradient (one parameter, no tuple).
    bare: bool
    #: What its result is (a tensor, a tuple of them...).
    result: Value = UNKNOWN
    #: The random op its forward runs (`torch.rand_like`), itself or in what it
    #: calls; None if none. Its VJP would recompute its context: refused then.
    draws: str | None = None


class Generator:
    """Emit reverse-mode statements over the steps in a slice."""

    def __init__(
        self,
        diff: Differentiator,
        program: Program,
        registry: Registry,
        names: NameAllocator,
        accumulators: dict[int, str],
        source: Sequence[str],
        siblings: Mapping[str, Sibling] | None = None,
        facts: ModuleFacts | None = None,
        shapes: ShapeFacts | None = None,
        line_length: int = 88,
    ) -> None:
        self.siblings = siblings or {}
        self.module = facts or ModuleFacts()
        self.facts = shapes
        self.line_length = line_length
        self.diff = diff
        self.program = program
        self.registry = registry
        self.names = names
        self.accumulators = accumulators
        self.source = source
        self.needed: set[int] = set()
        #: Sub-expressions the VJP reads, bound to names in forward (by node), and the
        #: lines that bind them, by the id of the (small) statement they go before.
        self.hoisted: dict[cst.CSTNode, Version] = {}
        self.hoists: dict[int, list[tuple[str, cst.BaseExpression]]] = {}
        self.extra: list[Version] = []
        #: The gradient variables of hoisted sub-expressions, whose blocks matter only
        #: where the plan promotes them.
        self.hoist_accumulators: set[str] = set()
        self.step: Assign | None = None
        #: Tests of branches named in forward, by the id of the test's node: the name,
        #: and whether the test may be a tensor (then its truth is taken, `bool(...)`).
        self.conditions: dict[int, tuple[str, bool]] = {}
        self.condition_versions: list[Version] = []
        #: The comment over each block, and the `line N: statement` it stands for.
        self.notes: dict[str, str] = {}

    def accumulator(self, version: Version) -> str:
        if version.id not in self.accumulators:
            self.accumulators[version.id] = self.names.fresh(f"grad_{version.name}")
        return self.accumulators[version.id]

    def run(self, needed: set[int]) -> list[cst.BaseStatement]:
        self.needed = needed
        return self.steps(self.program.steps)

    def steps(self, steps: list[Step]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for step in reversed(steps):
            if isinstance(step, Assign) and step.target.id in self.needed:
                out += self.assign(step)
            elif isinstance(step, Branch):
                out += self.branch(step)
        return out

    def branch(self, step: Branch) -> list[cst.BaseStatement]:
        body = self._transfers(step, 1) + self.steps(step.body)
        orelse = self._transfers(step, 2) + self.steps(step.orelse)
        if not body and not orelse:
            return []
        if _replayable(step.test, step.before, self.module):
            test = as_expression(step.test.visit(_Placeholders(step.before)))
        else:
            test = placeholder(self._condition(step))
        block = cst.IndentedBlock(body or [cst.SimpleStatementLine([cst.Pass()])])
        else_: cst.If | cst.Else | None = None
        if len(orelse) == 1 and isinstance(orelse[0], cst.If):
            else_ = orelse[0]  # the VJP of an `elif` chain reads as one
        elif orelse:
            else_ = cst.Else(cst.IndentedBlock(orelse))
        return [cst.If(test=test, body=block, orelse=else_)]

    def _condition(self, step: Branch) -> Version:
        """Name the test of a branch in forward (`cond = bool(h.sum() > 0)`), for a
        test that backward could not evaluate again to the same truth cheaply (it
        calls a function: `torch.rand(()) < p` would draw again) or without keeping
        a value it would not keep otherwise (`t is None` of a temporary)."""
        name = self.names.fresh("cond")
        version = Version(
            name, self.program.fresh_id(), SCALAR, step.top, step.in_branch, final=True
        )
        tensor = self.value(step.test, step.before).tensor is not False
        self.conditions[id(step.test)] = (name, tensor)
        self.condition_versions.append(version)
        return version

    def _transfers(self, step: Branch, side: int) -> list[cst.BaseStatement]:
        """Hand the gradient of each merged name to the version this side produced."""
        out: list[cst.BaseStatement] = []
        for merge in step.merges:
            merged = merge[0]
            source = merge[side] or step.before.get(merged.name)
            if merged.id not in self.needed or source is None or not source.value.diff:
                continue
            out.append(self._accumulate(source, cst.Name(self.accumulator(merged))))
        return out

    def _accumulate(
        self, version: Version, grad: cst.BaseExpression
    ) -> cst.SimpleStatementLine:
        acc = self.accumulator(version)
        call = cst.Call(cst.Name(ACCUMULATE), [cst.Arg(cst.Name(acc)), cst.Arg(grad)])
        return cst.SimpleStatementLine(
            [cst.Assign([cst.AssignTarget(cst.Name(acc))], call)]
        )

    def assign(self, step: Assign) -> list[cst.BaseStatement]:
        acc = cst.Name(self.accumulator(step.target))
        body: list[cst.BaseStatement] = []
        self.step = step
        hoisted_before = len(self.extra)
        self.expr(
            step.value, acc, placeholder(step.target), step.before, body, step.line
        )
        self.step = None
        if not body:
            return []
        blocks = self._block(step, acc, body)
        # A sub-expression this step named in forward (`d_exp = y.exp()` for
        # `d = y.exp() + 1.0`) is an output of its own: its gradient, which a higher
        # order sends, goes back to its operands by its own rule.
        for version in self.extra[hoisted_before:]:
            node = next(n for n, v in self.hoisted.items() if v is version)
            own = cst.Name(self.accumulator(version))
            self.hoist_accumulators.add(own.value)
            inner: list[cst.BaseStatement] = []
            self.expr(
                as_expression(node),
                own,
                placeholder(version),
                step.before,
                inner,
                step.line,
            )
            if inner:
                blocks += self._block(step, own, inner)
        return blocks

    def _block(
        self, step: Assign, acc: cst.Name, body: list[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        """`if acc is not None:` over `body`, with the source line as its comment."""
        text = (
            self.source[step.line - 1].strip()
            if 0 < step.line <= len(self.source)
            else ""
        )
        note = f"# line {step.line}: {text}"
        self.notes[note] = self.notes["# L" + note[3:]] = f"line {step.line}: {text}"
        test = cst.parse_expression(f"{acc.value} is not None")
        if len(f"    if {acc.value} is not None:  {note}") <= self.line_length:
            comment = cst.TrailingWhitespace(
                cst.SimpleWhitespace("  "), cst.Comment(note)
            )
            return [cst.If(test=test, body=cst.IndentedBlock(body, header=comment))]
        # On its own line: black would wrap the test to make room for a long comment.
        own = cst.EmptyLine(comment=cst.Comment("# L" + note[3:]))
        return [cst.If(test=test, body=cst.IndentedBlock(body), leading_lines=[own])]

    # -- expressions -----------------------------------------------------------------
    def value(self, node: cst.BaseExpression, env: Mapping[str, Version]) -> Value:
        return Evaluator(
            self.diff.qualified_names, {n: v.value for n, v in env.items()}, self.module
        ).expr(node)

    def expr(
        self,
        node: cst.BaseExpression,
        grad: cst.BaseExpression,
        out: cst.BaseExpression,
        env: Mapping[str, Version],
        body: list[cst.BaseStatement],
        line: int,
    ) -> None:
        """Add the statements that send `grad` (the gradient of `node`) to its operands."""
        if not self.value(node, env).diff:
            return
        if isinstance(node, cst.Name):
            version = env.get(node.value)
            if version is not None:
                body.append(self._accumulate(version, grad))
            return
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Plus):
            self.expr(node.expression, grad, out, env, body, line)
            return
        sibling = self._sibling(node)
        if sibling is not None:
            self.sibling_vjp(node, sibling, grad, env, body, line)
            return
        rule, args = self.match(node, env, line)
        rule = settled(rule, self._tensors(rule, args, env))
        wanted = {
            i
            for i, p in enumerate(rule.params)
            if rule.entries[i] is not None
            and p in args
            and self.value(args[p], env).diff
        }
        for i in sorted(wanted):
            kinds = self.value(args[rule.params[i]], env).kinds
            if kinds & {NUMBER, OTHER}:
                # A rule's entry is a tensor expression (`sum_to_size(b.shape)`):
                # where the operand may turn out a number, backward recomputes.
                shown = cst.Module([]).code_for_node(args[rule.params[i]])
                raise NoRule(line, f"`{shown}` may be a tensor or a number")
        for param in sorted(rule_reads(rule, wanted) & set(args)):
            self.hoist(args[param], env, param in rule.metadata_only)
        ph = _Placeholders(env, self.hoisted)
        converted = {p: as_expression(a.visit(ph)) for p, a in args.items()}
        result = inline(rule, converted, grad, out, wanted, self.names, args)
        body += result.statements
        pointwise = self._pointwise(node)
        for i in sorted(wanted):
            entry = result.entries[i]
            assert entry is not None
            arg = args[rule.params[i]]
            if pointwise:
                entry = self._unbroadcast(
                    node, arg, converted[rule.params[i]], entry, env
                )
            self.operand(arg, entry, env, body, line, rule.name.rstrip("_"))

    def _tensors(
        self,
        rule: Rule,
        args: Mapping[str, cst.BaseExpression],
        env: Mapping[str, Version],
    ) -> dict[str, bool]:
        """Per type-tested parameter whose argument is surely a tensor (True) or
        surely a Python number (False), which."""
        known = {}
        for param in rule.type_tested & set(args):
            kinds = self.value(args[param], env).kinds
            if kinds == {TENSOR}:
                known[param] = True
            elif kinds == {NUMBER}:
                known[param] = False
        return known

    def _pointwise(self, node: cst.BaseExpression) -> bool:
        """Whether the op broadcasts its operands to its result, elementwise."""
        if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation)):
            return not isinstance(getattr(node, "operator", None), cst.MatrixMultiply)
        if isinstance(node, cst.Call):
            name = callee_name(self.diff, node)
            return name is not None and opfacts.is_pointwise(name)
        return False

    def _unbroadcast(
        self,
        node: cst.BaseExpression,
        arg: cst.BaseExpression,
        converted: cst.BaseExpression,
        entry: cst.BaseExpression,
        env: Mapping[str, Version],
    ) -> cst.BaseExpression:
        """Drop `(e).sum_to_size(x.shape)` where the result has the shape of the
        operand `x` (a name or a sub-expression, `converted` as the rule reads it)."""
        if self.facts is None:
            return entry
        qualified = self.diff.qualified_names
        out = class_of(node, env, self.facts, qualified)
        if out is None or class_of(arg, env, self.facts, qualified) != out:
            return entry
        # `<e>.sum_to_size(<s>.shape)`, one argument (of any kind).
        if not (
            isinstance(entry, cst.Call)
            and isinstance(entry.func, cst.Attribute)
            and entry.func.attr.value == "sum_to_size"
            and len(entry.args) == 1
        ):
            return entry
        shape = entry.args[0].value
        if not (
            isinstance(shape, cst.Attribute)
            and shape.attr.value == "shape"
            and shape.value.deep_equals(converted)
        ):
            return entry
        inner = entry.func.value
        return inner.with_changes(lpar=[], rpar=[]) if inner.lpar else inner

    def operand(
        self,
        arg: cst.BaseExpression,
        entry: cst.BaseExpression,
        env: Mapping[str, Version],
        body: list[cst.BaseStatement],
        line: int,
        label: str,
    ) -> None:
        """Send a rule's gradient entry on to one argument expression."""
        if isinstance(arg, cst.Name):
            self.expr(arg, entry, arg, env, body, line)
            return
        name = cst.Name(self.names.fresh(f"grad_{label}"))
        body.append(
            cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(name)], entry)])
        )
        if isinstance(arg, (cst.List, cst.Tuple)):
            if any(isinstance(e, cst.StarredElement) for e in arg.elements):
                # `torch.stack([*u])`: how many pieces `*u` gives is not written.
                raise NoRule(line, f"`{_code(arg)}` spreads a sequence with `*`")
            for j, element in enumerate(arg.elements):
                item = cst.Subscript(
                    name, [cst.SubscriptElement(cst.Index(cst.Integer(str(j))))]
                )
                self.expr(element.value, item, element.value, env, body, line)
            return
        hoisted = self.hoisted.get(arg)
        out = (
            placeholder(hoisted)
            if hoisted
            else as_expression(arg.visit(_Placeholders(env, self.hoisted)))
        )
        self.expr(arg, name, out, env, body, line)

    def hoist(
        self, arg: cst.BaseExpression, env: Mapping[str, Version], metadata: bool
    ) -> None:
        """Name a sub-expression the VJP reads, where recomputing it in backward costs.

        Views are always recomputed (free). Other ops are named in forward when backward
        reads only their metadata (a shape costs nothing to keep) or when they are
        expensive (matrix products, softmax): then forward computes them once and the
        value is saved and promoted like any temporary.
        """
        step = self.step
        if step is None or step.target.in_branch or arg in self.hoisted:
            return
        if (
            isinstance(arg, (cst.Name, cst.Integer, cst.Float))
            or not self.value(arg, env).diff
        ):
            return
        if not (metadata or self._expensive(arg)):
            return
        name = self.names.fresh(f"{step.target.name}_{_op_name(arg)}")
        version = Version(
            name,
            self.program.fresh_id(),
            self.value(arg, env),
            step.target.top,
            False,
            final=True,
        )
        self.extra.append(version)
        self.hoisted[arg] = version
        if self.facts is not None:
            found = class_of(arg, env, self.facts, self.diff.qualified_names)
            if found is not None:
                self.facts.classes[version.id] = found
        self.hoists.setdefault(id(step.target.after), []).append((name, arg))

    def _expensive(self, node: cst.BaseExpression) -> bool:
        """Costly to recompute in backward: not a view and not elementwise (matrix
        products, reductions, softmax)."""
        if isinstance(node, cst.BinaryOperation):
            return isinstance(node.operator, cst.MatrixMultiply)
        if not isinstance(node, cst.Call):
            return False
        func = node.func
        name = self.diff.qualified_names.get(func) if dotted(func) else None
        if name is None and isinstance(func, cst.Attribute):
            name = f"torch.Tensor.{func.attr.value}"
        if name is None or opfacts.aten_name(name) is None:
            return False
        return not (opfacts.is_view(name) or opfacts.is_pointwise(name))

    def _sibling(self, node: cst.BaseExpression) -> Sibling | None:
        """Match `g(...)[0]`, the result of another differentiator of the module."""
        if not (
            isinstance(node, cst.Subscript)
            and calls_name(node.value)
            and len(node.slice) == 1
        ):
            return None
        index = node.slice[0].slice
        if not (
            isinstance(index, cst.Index)
            and isinstance(index.value, cst.Integer)
            and index.value.value == "0"  # as written: not `00` or `0x0`
        ):
            return None
        func = node.value.func
        assert isinstance(func, cst.Name)
        return self.siblings.get(func.value)

    def sibling_vjp(
        self,
        node: cst.BaseExpression,
        sibling: Sibling,
        grad: cst.BaseExpression,
        env: Mapping[str, Version],
        body: list[cst.BaseStatement],
        line: int,
    ) -> None:
        """Use a sibling's own lifted pair as the rule: recompute its context, run its
        backward (differentiable, so this is right at every order), route the gradients.
        """
        assert isinstance(node, cst.Subscript) and isinstance(node.value, cst.Call)
        call = node.value
        if sibling.draws is not None:
            raise NoRule(
                line,
                f"`{sibling.name}` draws random numbers "
                f"(`{sibling.draws.rsplit('.', 1)[-1]}`): its VJP would recompute "
                "its context and draw different ones",
            )
        if sibling.result.tensor is not True:
            # `pair(x)[0]` of a sibling whose result is a tuple: the pieces taken from
            # it are not one output of a rule; backward recomputes them.
            raise NoRule(line, f"the result of `{sibling.name}` is not one tensor")
        ph = _Placeholders(env, self.hoisted)
        converted = as_expression(
            call.with_changes(func=cst.Name(sibling.forward)).visit(ph)
        )
        ctx = cst.Name(self.names.fresh(f"{sibling.name}_ctx"))
        grads = cst.Name(self.names.fresh(f"grad_{sibling.name}"))
        body.append(
            _line(
                ctx,
                cst.Subscript(
                    converted, [cst.SubscriptElement(cst.Index(cst.Integer("1")))]
                ),
            )
        )
        body.append(
            _line(
                grads,
                cst.Call(cst.Name(sibling.backward), [cst.Arg(ctx), cst.Arg(grad)]),
            )
        )
        for i, arg in enumerate(call.args):
            if arg.star:
                raise NoRule(
                    line, f"`*` arguments to `{sibling.name}` cannot be routed"
                )
            index = (
                i if arg.keyword is None else sibling.params.index(arg.keyword.value)
            )
            if not self.value(arg.value, env).diff:
                continue
            entry: cst.BaseExpression = (
                grads
                if sibling.bare
                else cst.Subscript(
                    grads, [cst.SubscriptElement(cst.Index(cst.Integer(str(index))))]
                )
            )
            # Its backward may return the gradient unreduced (or None), as PyTorch
            # allows: summed to the argument's shape before it meets another.
            shape = cst.Attribute(
                self._shape_source(arg.value, env, line), cst.Name("shape")
            )
            entry = cst.Call(cst.Name(REDUCE), [cst.Arg(entry), cst.Arg(shape)])
            self.operand(arg.value, entry, env, body, line, sibling.name)

    def _shape_source(
        self, arg: cst.BaseExpression, env: Mapping[str, Version], line: int
    ) -> cst.BaseExpression:
        """What backward reads `arg`'s shape off: its version, or the sub-expression
        named in forward for its shape."""
        kinds = self.value(arg, env).kinds
        if kinds - {TENSOR}:
            # A number, a list, or an Optional left None: what the sibling's
            # backward gives it is not one tensor to sum to a shape.
            shown = cst.Module([]).code_for_node(arg)
            what = "a number" if kinds & {NUMBER, OTHER} else "a list or None"
            raise NoRule(line, f"`{shown}` may be {what}, not a tensor")
        if isinstance(arg, cst.Name) and arg.value in env:
            return placeholder(env[arg.value])
        self.hoist(arg, env, metadata=True)
        hoisted = self.hoisted.get(arg)
        if hoisted is not None:
            return placeholder(hoisted)
        return parenthesize(as_expression(arg.visit(_Placeholders(env, self.hoisted))))

    def match(
        self, node: cst.BaseExpression, env: Mapping[str, Version], line: int
    ) -> tuple[Rule, dict[str, cst.BaseExpression]]:
        """Find the rule for `node` and bind its operands to the rule's parameters."""
        if isinstance(node, cst.BinaryOperation) and any(
            self.value(side, env).kinds & {SEQ} for side in (node.left, node.right)
        ):
            # `[w] * 2`, `xs + ys`: repeating or joining lists, not tensor arithmetic.
            raise NoRule(line, f"`{_code(node)}` is arithmetic on a list or tuple")
        if isinstance(node, cst.BinaryOperation):
            key = _OPERATORS.get(type(node.operator))
            positional = [node.left, node.right]
            keywords: dict[str, cst.BaseExpression] = {}
        elif isinstance(node, cst.UnaryOperation) and isinstance(
            node.operator, cst.Minus
        ):
            key, positional, keywords = "operator.neg", [node.expression], {}
        elif isinstance(node, cst.Subscript) and _returns_sequence(
            node.value, self.value(node.value, env)
        ):
            raise NoRule(
                line, f"`{_code(node)}` indexes the tuple a call returns: no rule"
            )
        elif isinstance(node, cst.Subscript) and (
            self.value(node.value, env).tensor is not True
        ):
            # `xs[0]` of a list of tensors (a list parameter, `x.split(2)`): the rule
            # indexes one tensor, and would read the list's shape and device.
            raise NoRule(
                line, f"`{_code(node)}` indexes what may not be one tensor: no rule"
            )
        elif isinstance(node, cst.Subscript):
            key, positional, keywords = (
                "operator.getitem",
                [node.value, _index(node)],
                {},
            )
        elif isinstance(node, cst.Call):
            key, positional, keywords = self._call(node, env, line)
        else:
            raise NoRule(line, f"no derivative rule for `{_code(node)}`")
        rule = self.registry.rules.get(key or "")
        if rule is None and key == SETITEM and isinstance(node, cst.Call):
            name = cst.Module([]).code_for_node(node.args[0].value)
            raise NoRule(
                line, f"an item store `{name}[...] = ...` has no derivative rule"
            )
        if rule is None:
            raise NoRule(line, f"no derivative rule for `{_code(node)}`")
        return rule, _bind(rule, positional, keywords, line, node)

    def _call(
        self, node: cst.Call, env: Mapping[str, Version], line: int
    ) -> tuple[str, list[cst.BaseExpression], dict[str, cst.BaseExpression]]:
        positional: list[cst.BaseExpression] = []
        keywords: dict[str, cst.BaseExpression] = {}
        for arg in node.args:
            if arg.star:
                raise NoRule(
                    line, "a call with `*` or `**` arguments has no derivative rule"
                )
            if arg.keyword is None:
                positional.append(arg.value)
            else:
                keywords[arg.keyword.value] = arg.value
        qualified = (
            self.diff.qualified_names.get(node.func, "") if dotted(node.func) else ""
        )
        if qualified.startswith("torch."):
            return qualified, positional, keywords
        func = node.func
        if isinstance(func, cst.Attribute) and self.value(func.value, env).tensor:
            return (
                f"torch.Tensor.{func.attr.value}",
                [func.value, *positional],
                keywords,
            )
        return qualified, positional, keywords


_OP_NAMES: dict[type[cst.BaseBinaryOp], str] = {
    cst.Add: "sum",
    cst.Subtract: "diff",
    cst.Multiply: "prod",
    cst.Divide: "ratio",
    cst.Power: "pow",
    cst.MatrixMultiply: "matmul",
}


def _op_name(node: cst.BaseExpression) -> str:
    """Name a sub-expression by what computes it (`scores_matmul`, `h_exp`)."""
    if isinstance(node, cst.BinaryOperation):
        return _OP_NAMES.get(type(node.operator), "value")
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        if isinstance(func, cst.Name):
            return func.value
    if isinstance(node, cst.UnaryOperation):
        return "neg"
    return "value"


_METADATA = frozenset(METADATA_ATTRIBUTES) | frozenset(METADATA_METHODS)


def _replayable(
    test: cst.BaseExpression, env: Mapping[str, Version], module: ModuleFacts | None
) -> bool:
    """Whether backward may evaluate a branch's test again and find the truth forward
    found, at no cost: it calls nothing but metadata methods, reads nothing but
    metadata of forward's values, and the other names it reads are parameters or
    hold no tensor (`causal`, `x.dim() > 2`, `bias is not None`, `mode == "sum"`).
    A module-level object other than a number (`CFG["fast"]`, a dict that may change
    between forward and a double backward) is forward's truth only: it is kept."""
    constants = module.constants if module is not None else {}
    found = nodes(test)
    attributes = [n for n in found if isinstance(n, cst.Attribute)]
    metadata_of = {id(a.value) for a in attributes if a.attr.value in _METADATA}
    attribute_names = {id(a.attr) for a in attributes}
    for node in found:
        if isinstance(node, cst.Call):
            func = node.func
            if not (
                isinstance(func, cst.Attribute) and func.attr.value in METADATA_METHODS
            ):
                return False
        elif isinstance(node, cst.Name) and id(node) not in attribute_names:
            version = env.get(node.value)
            if version is None:
                constant = constants.get(node.value)
                if constant is not None and constant.kinds - {NUMBER, NONE}:
                    return False
                continue
            if version.is_param:
                continue
            if version.value.holds_tensor and id(node) not in metadata_of:
                return False
        elif isinstance(node, cst.Attribute) and node.attr.value not in _METADATA:
            if isinstance(node.value, cst.Name) and node.value.value in env:
                return False  # `t.requires_grad`: not forward's truth in backward
    return True


def _returns_sequence(node: cst.BaseExpression, value: Value) -> bool:
    """Tell whether a call returns several values (`x.split(2)`, `x.max(dim=1)`)."""
    return isinstance(node, cst.Call) and SEQ in value.kinds


def _line(target: cst.Name, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


def _index(node: cst.Subscript) -> cst.BaseExpression:
    """Return the index of `x[...]` as one expression (a tuple for `x[a, b]`)."""
    parts: list[cst.BaseExpression] = []
    for element in node.slice:
        part = element.slice
        if isinstance(part, cst.Index):
            parts.append(part.value)
        else:
            assert isinstance(part, cst.Slice)
            args = [part.lower or cst.Name("None"), part.upper or cst.Name("None")]
            if part.step is not None:
                args.append(part.step)
            parts.append(cst.Call(cst.Name("slice"), [cst.Arg(a) for a in args]))
    if len(parts) == 1:
        return parts[0]
    return cst.Tuple([cst.Element(p) for p in parts])


def _bind(
    rule: Rule,
    positional: list[cst.BaseExpression],
    keywords: Mapping[str, cst.BaseExpression],
    line: int,
    node: cst.BaseExpression,
) -> dict[str, cst.BaseExpression]:
    """Bind call arguments to a rule's parameters as Python would, varargs included;
    `node` is the call, for the messages."""
    bound: dict[str, cst.BaseExpression] = {}
    params = list(rule.params)
    if rule.varargs is not None:
        at = params.index(rule.varargs)
        head, rest = positional[:at], positional[at:]
        if rest:
            packed = cst.Tuple([cst.Element(parenthesize(a)) for a in rest])
            bound[rule.varargs] = packed
        positional = head
    if len(positional) > len(params):
        raise NoRule(
            line,
            f"`{_code(node)}` passes more arguments than its rule `{rule.name}` takes",
        )
    for name, value in zip(params, positional, strict=False):
        bound[name] = value
    for key, value in keywords.items():
        if key not in params or key in bound:
            raise NoRule(
                line,
                f"`{_code(node)}`: the rule `{rule.name}` has no parameter `{key}` to bind",
            )
        bound[key] = value
    for name in params:
        if name not in bound:
            default = rule.defaults.get(name)
            if default is None:
                raise NoRule(
                    line,
                    f"`{_code(node)}` leaves `{name}` of rule `{rule.name}` unbound",
                )
            bound[name] = default
    return bound


def callee_name(diff: Differentiator, call: cst.Call) -> str | None:
    """The op a call runs: a torch function by name, or a tensor method."""
    func = call.func
    name = diff.qualified_names.get(func) if dotted(func) else None
    if name is not None and name.startswith("torch."):
        return name
    if isinstance(func, cst.Attribute):
        return f"torch.Tensor.{func.attr.value}"
    return None


def _code(node: cst.CSTNode) -> str:
    """The source text of `node`, for a message (written only when one is raised)."""
    return cst.Module([]).code_for_node(node)
