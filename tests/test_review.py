"""`s2sgrad review`: golden text for two samples, the records behind it, colors, HTML."""

import difflib
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.review.model import review
from s2sgrad.review.page import render_html
from s2sgrad.review.text import render_text

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "review"

#: sample -> terminal width: one side by side, one too narrow for that (stacked).
CASES = {"temporary": 200, "options": 80}


def env(**extra):
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS")}
    return {**base, "PYTHONPATH": str(ROOT), **extra}


def refresh_command(name):
    return (
        f"COLUMNS={CASES[name]} s2sgrad review samples/{name}.py "
        f"> tests/golden/review/{name}.txt"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_review_text_matches_golden(name):
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "review", f"samples/{name}.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env(COLUMNS=str(CASES[name])),
    )
    assert run.returncode == 0, run.stderr
    assert "\x1b[" not in run.stdout  # not a terminal: no colors
    expected = (GOLDEN / f"{name}.txt").read_text()
    if run.stdout != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                run.stdout.splitlines(keepends=True),
                f"tests/golden/review/{name}.txt",
                "s2sgrad review",
            )
        )
        pytest.fail(
            f"review output changed:\n{diff}\nIf the change is intended, refresh with "
            f"(from the repository root):\n    {refresh_command(name)}"
        )


def records(source, options=None):
    return review(source, Origin("ops.py", "ops"), options or Options(), "ops_grad.py")


CUBIC = """import torch


def cubic(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0):
    s = x * x
    n = x.numel()
    def backward(grad):
        return 3.0 * grad * s * alpha / n + 0 * y.sum(), None, None
    return s * x, backward
"""


def by_name(record):
    return {c.name: c for c in record.captures}


def test_records_say_what_each_capture_is_and_how_it_is_kept():
    (record,) = records(CUBIC)
    captures = by_name(record)
    # The closure's, in context order: tensors first, each by first reference.
    assert list(captures)[:4] == ["s", "y", "alpha", "n"]
    s, alpha, n = captures["s"], captures["alpha"], captures["n"]
    assert (s.kind, s.promoted, s.read_by, s.line) == ("temporary", True, "closure", 8)
    assert s.saved == "extra output, ctx.save_for_backward"
    assert s.gradient == "generated VJP: backward takes grad_s"
    assert (alpha.kind, alpha.saved, alpha.extra_output) == (
        "input",
        "ctx.alpha",
        False,
    )
    assert (n.kind, n.saved) == ("constant", "passed on from forward in a tuple, ctx.n")
    assert "x * x" in " ".join(record.vjp_statements)
    assert record.source.text.startswith(
        "def cubic(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0):\n"
    )
    assert record.source.first_line == 4
    titles = [snippet.title for snippet in record.generated]
    assert titles == ["ops_grad.py: cubic_forward", "ops_grad.py: cubic_backward"]
    assert record.generated[1].text.startswith("def cubic_backward(")


def test_context_layout_follows_the_tuple_forward_returns():
    (record,) = records(CUBIC)
    assert [slot.name for slot in record.context] == [
        "s",
        "y",
        "x",
        "alpha",
        "n",
    ]
    # x's shape is read off the saved x, not carried beside it.
    assert "return s * x, (s, y, x, alpha, n)" in record.generated[0].text
    tensors = [
        slot for slot in record.context if slot.location.startswith("ctx.saved_tensors")
    ]
    assert [t.location for t in tensors] == [
        f"ctx.saved_tensors[{i}]" for i in range(len(tensors))
    ]
    assert {slot.name: slot.location for slot in record.context}["alpha"] == "ctx.alpha"


def test_recomputed_temporary_says_why_and_is_not_saved():
    source = CUBIC.replace(
        "def cubic(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0):",
        "def cubic(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0):  # s2sgrad: policy=recompute",
    )
    (record,) = records(source)
    (temporary,) = record.temporaries
    assert (temporary.name, temporary.how) == ("s", "recompute")
    assert temporary.why == "the recompute policy is set for this function"
    s = by_name(record)["s"]
    assert (s.recomputed, s.slot, s.saved) == (
        True,
        None,
        "not saved: recomputed in backward",
    )
    assert [snippet.title.split(": ")[1] for snippet in record.generated] == [
        "cubic_forward",
        "cubic_recompute",
        "cubic_backward",
    ]
    assert by_name(record)["x"].read_by == "recompute"


def test_first_order_temporary_is_saved_only():
    (record,) = records(CUBIC, Options(policy="first-order"))
    (temporary,) = record.temporaries
    assert temporary.how == "saved only" and "first-order policy" in temporary.why
    assert record.first_order
    assert (
        by_name(record)["s"].saved
        == "passed on from forward in a tuple, ctx.save_for_backward"
    )


def test_colors_mark_captures_by_kind_and_plain_text_has_none():
    (record,) = records(CUBIC)
    colored = render_text([record], 200, color=True)
    assert "\x1b[1;35ms\x1b[0m" in colored  # the temporary, in magenta
    assert "\x1b[1;34malpha\x1b[0m" in colored  # an input, in blue
    plain = render_text([record], 200, color=False)
    assert "\x1b" not in plain
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == plain


def run_in_terminal(args, **extra):
    """Run the CLI with stdout on a pseudo-terminal; return what it printed there."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "s2sgrad", *args],
        cwd=ROOT,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env(**extra),
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait() == 0, process.stderr.read()
    return b"".join(chunks).decode()


def test_terminal_output_is_colored_unless_no_color_is_set():
    assert "\x1b[1;35mt\x1b[0m" in run_in_terminal(["review", "samples/temporary.py"])
    plain = run_in_terminal(["review", "samples/temporary.py"], NO_COLOR="1")
    assert "\x1b[" not in plain and "Captures" in plain


def test_html_is_self_contained_and_escapes_user_text():
    source = CUBIC.replace("    s = x * x\n", '    """a <b> & c"""\n    s = x * x\n')
    page = render_html(records(source), "<ops>")
    assert "a &lt;b&gt; &amp; c" in page and "<b>" not in page
    assert "<title>s2sgrad review: &lt;ops&gt;</title>" in page
    for remote in ("http://", "https://", "<script", "<link", "src=", "url("):
        assert remote not in page
    assert page.count('<table class="captures">') == 1
    assert '<mark class="capture-temporary" title="s: temporary">s</mark>' in page


def test_review_of_bad_input_exits_2(tmp_path):
    (tmp_path / "bad.py").write_text("def f(x):\n    return x\n")
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "review", "bad.py", "--html", "page.html"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env(),
    )
    assert run.returncode == 2
    assert "error[S2S003]" in run.stderr
    assert not (tmp_path / "page.html").exists()
