"""A forward that s2sgrad rewrites keeps its source lines (issue 23, point 6).

An in-place write to a differentiable tensor is written out of place before lifting
(s2sgrad/inplace.py). That rewrite rebuilt every statement of forward, and only the
rewritten ones kept their line: the gradient blocks of the others said `# line 0:`.
"""

import re

import libcst as cst

from s2sgrad import transform
from s2sgrad.frontend import parse
from s2sgrad.inplace import out_of_place
from s2sgrad.values import forward_values

SOURCE = """\
import torch


def relu_scale(x: torch.Tensor, w: torch.Tensor):
    h = x * w
    h.relu_()
    def backward(grad):
        g = grad * h * 2.0
        return g * w, g * x
    return h * h, backward


def shifted(x: torch.Tensor, y: torch.Tensor):
    t = x * y
    if x.dim() > 1:
        t = t * 2.0
    t += y
    def backward(grad):
        return grad * 2.0 * t * y, grad * 2.0 * t * (x + 1.0)
    return t * t, backward
"""


def test_gradient_blocks_beside_an_in_place_write_quote_their_source_line():
    text = transform(SOURCE, "rewritten.py")
    notes = re.findall(r"# line (\d+):[ ]?(.*)", text)
    assert "# line 0" not in text
    lines = SOURCE.splitlines()
    assert notes and all(lines[int(n) - 1].strip() == quoted for n, quoted in notes)
    quoted = {quoted for _, quoted in notes}
    # the statements s2sgrad rewrote, and those beside them (at top level and in an if)
    assert {"h.relu_()", "h = x * w", "t += y", "t = x * y", "t = t * 2.0"} <= quoted


def test_every_statement_of_a_rewritten_forward_keeps_its_line():
    parsed = parse(SOURCE, "rewritten.py")
    for diff in parsed.differentiators:
        rewritten = out_of_place(
            diff, forward_values(diff).env, "rewritten.py", parsed.lines
        )
        assert rewritten is not diff
        before = [
            diff.statement_lines[n] for s in diff.statements for n in _statements(s)
        ]
        after = [
            rewritten.statement_lines.get(n, 0)
            for s in rewritten.statements
            for n in _statements(s)
        ]
        assert after == before


def _statements(root: cst.CSTNode) -> list[cst.BaseStatement]:
    """`root` and the statements nested in it."""
    found: list[cst.BaseStatement] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, cst.BaseStatement):
                found.append(node)
            return True

    root.visit(Collect())
    return found
