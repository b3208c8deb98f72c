"""`s2sgrad convert --check/--diff`, run in subprocesses: every exit code, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from s2sgrad import transform

ROOT = Path(__file__).resolve().parent.parent

SQUARE = """import torch


def square(x):
    def backward(grad):
        return 2.0 * grad * x
    return x * x, backward
"""

CUBE = """import torch


def cube(x):
    def backward(grad):
        return 3.0 * grad * x * x
    return x * x * x, backward
"""

BAD = """def f(x):
    def backward(grad):
        return grad
    return x, backward, 1
"""


def s2sgrad(*args, cwd, prelude=""):
    """Run the CLI as a user would; `prelude` runs first (to fake an internal error)."""
    code = f"import sys\n{prelude}\nfrom s2sgrad.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def square_grad():
    """What `s2sgrad convert pkg/square.py` writes (the same engine, in process)."""
    return transform(SQUARE, "pkg/square.py", module_name="square")


@pytest.fixture
def project(tmp_path, square_grad):
    """A project root with `pkg/square.py` up to date."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "square.py").write_text(SQUARE)
    (pkg / "square_grad.py").write_text(square_grad)
    return tmp_path


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_check_up_to_date_file_exits_0(project):
    before = snapshot(project)
    run = s2sgrad("convert", "--check", "pkg/square.py", cwd=project)
    assert run.returncode == 0, run.stderr
    assert "1 output(s) up to date" in run.stderr
    assert run.stdout == ""
    assert snapshot(project) == before


def test_check_lists_stale_and_missing_outputs_of_a_directory_and_exits_1(project):
    (project / "pkg" / "cube.py").write_text(CUBE)
    stale = project / "pkg" / "square_grad.py"
    stale.write_text(stale.read_text().replace("2.0 * grad", "2.5 * grad"))
    before = snapshot(project)
    run = s2sgrad("convert", "--check", "pkg", cwd=project)
    assert run.returncode == 1, run.stderr
    assert "would create pkg/cube_grad.py (missing)" in run.stderr
    assert "would update pkg/square_grad.py (stale)" in run.stderr
    assert "2 of 2 output(s) would change" in run.stderr
    assert run.stdout == ""
    assert snapshot(project) == before


def test_check_counts_crlf_line_endings_as_stale(project):
    output = project / "pkg" / "square_grad.py"
    output.write_bytes(output.read_bytes().replace(b"\n", b"\r\n"))
    run = s2sgrad("convert", "--check", "pkg/square.py", cwd=project)
    assert run.returncode == 1
    assert "would update pkg/square_grad.py (stale)" in run.stderr


def test_diff_of_an_up_to_date_directory_is_empty_and_exits_0(project):
    run = s2sgrad("convert", "--diff", "pkg", cwd=project)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""


def test_diff_of_a_stale_output_labels_it_without_timestamps_and_exits_1(project):
    output = project / "pkg" / "square_grad.py"
    fresh = output.read_text()
    output.write_text(fresh.replace("2.0 * grad", "2.5 * grad"))
    before = snapshot(project)
    run = s2sgrad("convert", "--diff", "pkg/square.py", cwd=project)
    assert run.returncode == 1, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:2] == ["--- pkg/square_grad.py", "+++ pkg/square_grad.py"]
    assert any(line.startswith("-") and "2.5 * grad" in line for line in lines)
    assert any(line.startswith("+") and "2.0 * grad" in line for line in lines)
    assert snapshot(project) == before
    # The diff is a real patch: applying it gives the generated text.
    patch = subprocess.run(
        ["patch", "-p0", "--dry-run"],
        input=run.stdout,
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert patch.returncode == 0, patch.stdout + patch.stderr


def test_diff_of_a_missing_output_adds_every_line(project):
    (project / "pkg" / "cube.py").write_text(CUBE)
    run = s2sgrad("convert", "--diff", "pkg/cube.py", "-o", "out", cwd=project)
    assert run.returncode == 1
    assert run.stdout.startswith(
        "--- out/cube_grad.py\n+++ out/cube_grad.py\n@@ -0,0 +1,"
    )
    assert "+def cube_forward(x: Tensor) -> tuple[Tensor, Context]:" in run.stdout
    assert not (project / "out").exists()


def test_check_and_diff_together_report_only_what_would_change(project):
    (project / "pkg" / "cube.py").write_text(CUBE)
    run = s2sgrad("convert", "--check", "--diff", "pkg", cwd=project)
    assert run.returncode == 1
    assert run.stdout.startswith("--- pkg/cube_grad.py\n")
    assert "square_grad.py" not in run.stdout + run.stderr.replace("2 output", "")
    assert "1 of 2 output(s) would change" in run.stderr
    assert not (project / "pkg" / "cube_grad.py").exists()


@pytest.mark.parametrize("flag", ["--check", "--diff"])
def test_input_error_exits_2_and_writes_nothing(project, flag):
    (project / "pkg" / "bad.py").write_text(BAD)
    before = snapshot(project)
    run = s2sgrad("convert", flag, "pkg", cwd=project)
    assert run.returncode == 2
    assert "pkg/bad.py:4:" in run.stderr and "error[S2S" in run.stderr
    assert run.stdout == ""
    assert snapshot(project) == before


@pytest.mark.parametrize(
    "args, message",
    [
        (["--check", "--stdout", "pkg"], "--stdout cannot be combined"),
        (["--diff", "nowhere"], "no such file or directory: nowhere"),
        (
            ["--check", "--line-length", "0", "pkg"],
            "--line-length: must be a positive integer",
        ),
    ],
)
def test_usage_error_exits_2(project, args, message):
    run = s2sgrad("convert", *args, cwd=project)
    assert run.returncode == 2
    assert message in run.stderr


@pytest.mark.parametrize(
    "flag, broken", [("--check", "status"), ("--diff", "unified_diff")]
)
def test_internal_error_exits_123_and_says_it_is_a_bug(project, flag, broken):
    prelude = (
        "import s2sgrad.cli\n"
        "def boom(*args):\n    raise RuntimeError('boom')\n"
        f"s2sgrad.cli.{broken} = boom"
    )
    (project / "pkg" / "cube.py").write_text(CUBE)
    run = s2sgrad("convert", flag, "pkg", cwd=project, prelude=prelude)
    assert run.returncode == 123
    assert "internal error: RuntimeError: boom" in run.stderr
    assert "This is a bug in s2sgrad" in run.stderr


def test_pre_commit_hooks_regenerate_and_check_serially():
    hooks = {
        h["id"]: h
        for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    }
    assert set(hooks) == {"s2sgrad", "s2sgrad-check"}
    assert hooks["s2sgrad"]["entry"] == "s2sgrad convert"
    assert hooks["s2sgrad-check"]["entry"] == "s2sgrad convert --check --diff"
    for hook in hooks.values():
        # Outputs depend on sources the commit may not touch: convert the whole tree,
        # once, never in parallel batches that would race on the same files.
        assert hook["pass_filenames"] is False
        assert hook["require_serial"] is True
        assert hook["language"] == "python"


# -- the header fast path -------------------------------------------------------------

NO_ENGINE = (
    "import builtins\n"
    "_real_import = builtins.__import__\n"
    "def _guarded(name, *args, **kwargs):\n"
    "    if name.split('.')[0] in ('libcst', 'black') or name.startswith('s2sgrad.pipeline'):\n"
    "        raise ImportError('the engine was imported: ' + name)\n"
    "    return _real_import(name, *args, **kwargs)\n"
    "builtins.__import__ = _guarded\n"
)


def test_check_of_an_up_to_date_output_answers_from_its_header(project):
    """Without libcst or black importable, an up-to-date output still checks clean."""
    run = s2sgrad("convert", "--check", "pkg/square.py", cwd=project, prelude=NO_ENGINE)
    assert run.returncode == 0, run.stderr
    assert "1 output(s) up to date" in run.stderr


def test_check_catches_a_hand_edit_of_the_body(project):
    """The header's body digest: an edit below the header is stale, not up to date."""
    out = project / "pkg" / "square_grad.py"
    out.write_text(out.read_text().replace("2.0 * grad * x", "3.0 * grad * x"))
    run = s2sgrad("convert", "--check", "pkg/square.py", cwd=project)
    assert run.returncode == 1, run.stderr
    assert "would update pkg/square_grad.py (stale)" in run.stderr


@pytest.mark.parametrize(
    "change",
    ["source", "options", "format", "header"],
)
def test_check_converts_when_the_header_does_not_match(project, change):
    out = project / "pkg" / "square_grad.py"
    text = out.read_text()
    args = ["convert", "--check", "pkg/square.py"]
    if change == "source":
        (project / "pkg" / "square.py").write_text(SQUARE.replace("2.0", "2.00"))
    elif change == "options":
        args.append("--policy=first-order")
    elif change == "format":
        out.write_text(text.replace("# s2sgrad-format: ", "# s2sgrad-format: 1"))
    else:
        out.write_text("\n".join(text.split("\n")[3:]))
    # The engine runs: with it forbidden, the check fails instead of answering.
    blocked = s2sgrad(*args, cwd=project, prelude=NO_ENGINE)
    assert blocked.returncode == 123, blocked.stderr
    run = s2sgrad(*args, cwd=project)
    assert run.returncode == 1, run.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_output_whose_source_lost_its_differentiators_is_reported(project, workers):
    """A source in a directory that has no differentiators now leaves its old output
    behind: `--check` and `--diff` fail on it, and `convert` says to delete it (it
    deletes nothing). A module named like an output that s2sgrad did not write is
    left alone."""
    (project / "pkg" / "cube.py").write_text(CUBE)
    (project / "pkg" / "square.py").write_text("import torch\n\nX = 1\n")
    (project / "pkg" / "plain.py").write_text("Y = 2\n")
    (project / "pkg" / "plain_grad.py").write_text("Z = 3\n")
    assert s2sgrad("convert", "pkg/cube.py", cwd=project).returncode == 0
    before = snapshot(project)
    said = (
        "pkg/square_grad.py was generated from pkg/square.py, which has no "
        "differentiators now: delete it"
    )
    for flags in (["--check"], ["--diff"], []):
        run = s2sgrad("convert", *flags, "-j", workers, "pkg", cwd=project)
        assert run.returncode == (1 if flags else 0), run.stderr
        assert said in run.stderr
        assert "plain" not in run.stderr
        assert snapshot(project) == before
    (project / "pkg" / "square_grad.py").unlink()
    run = s2sgrad("convert", "--check", "-j", workers, "pkg", cwd=project)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("into", [None, "out"])
def test_an_output_whose_source_file_is_gone_is_reported(project, workers, into):
    """Deleting a source leaves its old output behind, in the tree or under `-o`:
    `--check` and `--diff` fail on it, `convert` says to delete it and deletes
    nothing. An output that another directory's run wrote under the same `-o`, and
    a module named like an output that s2sgrad did not write, are left alone."""
    (project / "pkg" / "cube.py").write_text(CUBE)
    (project / "other").mkdir()
    (project / "other" / "tri.py").write_text(CUBE.replace("cube", "tri"))
    (project / "pkg" / "plain_grad.py").write_text("Z = 3\n")
    out = [] if into is None else ["-o", into]
    for tree in ("pkg", "other"):
        assert s2sgrad("convert", *out, tree, cwd=project).returncode == 0
    (project / "pkg" / "square.py").unlink()
    before = snapshot(project)
    output = "pkg/square_grad.py" if into is None else "out/square_grad.py"
    said = f"{output} was generated from pkg/square.py, which is gone: delete it"
    for flags in (["--check"], ["--diff"], []):
        run = s2sgrad("convert", *flags, "-j", workers, *out, "pkg", cwd=project)
        assert run.returncode == (1 if flags else 0), run.stderr
        assert said in run.stderr
        assert "plain" not in run.stderr and "tri" not in run.stderr
        assert snapshot(project) == before
    (project / output).unlink()
    run = s2sgrad("convert", "--check", "-j", workers, *out, "pkg", cwd=project)
    assert run.returncode == 0, run.stderr


def test_a_tree_left_with_only_an_output_whose_source_is_gone(project):
    """Not "no differentiators found": the output is what is wrong."""
    (project / "pkg" / "square.py").unlink()
    run = s2sgrad("convert", "--check", "pkg", cwd=project)
    assert run.returncode == 1, run.stderr
    assert "pkg/square_grad.py was generated from pkg/square.py, which is gone" in run.stderr
    assert "no differentiators found" not in run.stderr


@pytest.mark.parametrize("where", ["pkg", "elsewhere"])
def test_outputs_are_the_same_from_any_working_directory(project, tmp_path_factory, where):
    """An outside probe: the header and the docstrings named the source relative to
    the working directory, so `--check` from inside the package (or from another
    folder) found every output stale, and `--diff` showed only paths changing. They
    name it relative to the project's root now: from anywhere, the same bytes."""
    before = snapshot(project)
    cwd = project / "pkg" if where == "pkg" else tmp_path_factory.mktemp("elsewhere")
    path = str(project / "pkg") if where == "elsewhere" else "."
    run = s2sgrad("convert", "--check", path, cwd=cwd)
    assert run.returncode == 0, run.stderr
    (project / "pkg" / "square_grad.py").unlink()
    assert s2sgrad("convert", path, cwd=cwd).returncode == 0
    assert snapshot(project) == before


def test_two_trees_into_one_output_folder_outside_the_project(project, tmp_path_factory):
    """An outside probe, after the header's path became the project root's: two
    folders converted from a subfolder into one `-o` folder outside the project each
    called the other's output gone ("delete it"), and `--check` failed. The header
    is read against the converted directory's project, not the output's."""
    (project / "pkg2").mkdir()
    (project / "pkg2" / "cube.py").write_text(CUBE)
    out = str(tmp_path_factory.mktemp("shared_out"))
    cwd = project / "pkg"
    for tree in (".", "../pkg2"):
        run = s2sgrad("convert", tree, "-o", out, cwd=cwd)
        assert run.returncode == 0 and "gone" not in run.stderr, run.stderr
    run = s2sgrad("convert", "--check", ".", "-o", out, cwd=cwd)
    assert run.returncode == 0 and "gone" not in run.stderr, run.stderr
