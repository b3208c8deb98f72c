"""`s2sgrad convert --check` of up-to-date outputs is mostly start-up: it imports only
what answering from the headers needs. Each module pinned here cost a share of it."""

import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from s2sgrad import transform
from s2sgrad.config import POLICIES, Config
from s2sgrad.options import Options, Policy

ROOT = Path(__file__).resolve().parent.parent

SQUARE = """import torch


def square(x):
    def backward(grad):
        return 2.0 * grad * x
    return x * x, backward
"""

#: Loaded only where used: to convert or write, for `run`, on an error, or (tomllib)
#: to parse a `pyproject.toml`. `dataclasses` loads `inspect`: `Options` and
#: `Diagnostic`, the dataclasses, are built only to convert or on an error.
LAZY = (
    "dataclasses",
    "inspect",
    "tempfile",
    "traceback",
    "tomllib",
    "concurrent.futures.process",
    "s2sgrad.hook",
    "s2sgrad.options",
    "s2sgrad.diagnostics",
    "s2sgrad.pipeline",
    "libcst",
    "black",
)

CHECK = """\
import sys
from s2sgrad.cli import main
code = main(["convert", "--check", "-j", "2", "pkg/square.py", "pkg"])
print(code)
print(" ".join(sorted(m for m in {lazy!r} if m in sys.modules)))
"""


@pytest.fixture(scope="module")
def square_grad():
    """What `s2sgrad convert pkg/square.py` writes (the same engine, in process)."""
    return transform(SQUARE, "pkg/square.py", module_name="square")


@pytest.fixture
def project(tmp_path, square_grad):
    """A project root (a `.git` folder, no `pyproject.toml`), its output up to date."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "square.py").write_text(SQUARE)
    (tmp_path / "pkg" / "square_grad.py").write_text(square_grad)
    # A second module, found only through the directory (a file named twice, as
    # `pkg/square.py` and inside `pkg`, is checked once).
    (tmp_path / "pkg" / "other.py").write_text(SQUARE)
    other = transform(SQUARE, "pkg/other.py", module_name="other")
    (tmp_path / "pkg" / "other_grad.py").write_text(other)
    return tmp_path


def check_loads(project):
    """Run `--check` on a file and a directory; return the lazy modules it loaded."""
    run = subprocess.run(
        [sys.executable, "-c", CHECK.format(lazy=LAZY)],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    code, loaded = run.stdout.split("\n")[:2]
    assert code == "0", run.stderr
    assert run.stderr == "s2sgrad: 2 output(s) up to date\n"
    return set(loaded.split())


def test_check_of_up_to_date_outputs_loads_only_what_it_needs(project):
    assert check_loads(project) == set()


def test_check_parses_pyproject_toml_without_building_options(project):
    (project / "pyproject.toml").write_text("[tool.s2sgrad]\nline-length = 88\n")
    assert check_loads(project) == {"tomllib"}


@pytest.mark.parametrize(
    "config",
    [
        Config(),
        Config(policy="recompute", line_length=100, suffix="_d"),
        Config(compile="strict"),
        Config(compile=True, standalone=True, suffix='_é"\\'),
    ],
)
def test_the_check_digest_of_a_config_is_its_options_key(config):
    """`--check` digests the settings without building `Options`: the same key."""
    assert config.options_key() == config.options().key()


def test_the_policies_config_accepts_are_those_of_options():
    assert POLICIES == get_args(Policy)
    assert Options().key() == Config().options_key()


CONVERT = """\
import sys
from s2sgrad.cli import main
code = main(["convert", "-q", "-j", "1", "pkg/square.py"])
print(code, "libcst.matchers" in sys.modules, "s2sgrad.pipeline" in sys.modules)
"""


def test_converting_does_not_import_libcst_matchers(project):
    """Importing `libcst.matchers` costs 0.12 s of every cold conversion: the stages
    test nodes with `isinstance` and `s2sgrad.cst`'s shapes instead."""
    (project / "pkg" / "square_grad.py").unlink()
    run = subprocess.run(
        [sys.executable, "-c", CONVERT],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "False", "True"]
    assert (project / "pkg" / "square_grad.py").exists()
