"""`[tool.s2sgrad]`: found by walking up, checked key by key, overridden by flags."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from s2sgrad.config import Config, ConfigError, load_config
from s2sgrad.options import Options

ROOT = Path(__file__).resolve().parent.parent

SQUARE = """import torch


def square(x):
    t = x * x
    def backward(grad):
        return 2.0 * grad * x + 0 * t
    return t + x, backward
"""


def write_project(root, table):
    (root / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n\n{table}")
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "ops.py").write_text(SQUARE)
    return root / "src" / "pkg" / "ops.py"


def error(tmp_path, table):
    write_project(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load_config([tmp_path / "src"])
    return str(caught.value)


def test_found_by_walking_up_from_the_input(tmp_path, monkeypatch):
    source = write_project(
        tmp_path,
        "[tool.s2sgrad]\n"
        'suffix = "_lifted"\noutput-dir = "generated"\npolicy = "first-order"\n'
        'line-length = 100\ninclude = ["src/*"]\nexclude = ["*_test.py"]\n',
    )
    monkeypatch.chdir(tmp_path / "src")
    config = load_config([source])
    assert config == Config(
        path=tmp_path / "pyproject.toml",
        suffix="_lifted",
        output_dir=tmp_path / "generated",  # relative to pyproject.toml, not the cwd
        policy="first-order",
        line_length=100,
        include=("src/*",),
        exclude=("*_test.py",),
    )
    assert config.options() == Options("first-order", 100, "_lifted")


def test_the_project_root_ends_the_walk(tmp_path):
    write_project(tmp_path, '[tool.s2sgrad]\nsuffix = "_outer"\n')
    inner = tmp_path / "vendored"
    (inner / ".git").mkdir(parents=True)
    (inner / "ops.py").write_text(SQUARE)
    assert load_config([inner / "ops.py"]) == Config()


def test_without_the_table_the_defaults_hold(tmp_path):
    source = write_project(tmp_path, "[tool.black]\nline-length = 100\n")
    config = load_config([source])
    assert config == Config(path=tmp_path / "pyproject.toml")
    assert config.options() == Options()


def test_flags_override_the_file(tmp_path):
    source = write_project(
        tmp_path, '[tool.s2sgrad]\npolicy = "recompute"\nsuffix = "_l"\n'
    )
    config = load_config([source]).override(
        policy="promote", line_length=None, suffix=None, output_dir=Path("out")
    )
    assert (config.policy, config.suffix, config.output_dir) == (
        "promote",
        "_l",
        Path("out"),
    )


def test_include_and_exclude_select_files_found_in_directories(tmp_path):
    write_project(
        tmp_path, '[tool.s2sgrad]\ninclude = ["src/*"]\nexclude = ["legacy_*.py"]\n'
    )
    config = load_config([tmp_path / "src"])
    assert config.selects(tmp_path / "src" / "pkg" / "ops.py")
    assert not config.selects(tmp_path / "src" / "pkg" / "legacy_ops.py")
    assert not config.selects(tmp_path / "tools" / "ops.py")


def test_standalone_key_reaches_the_options(tmp_path):
    source = write_project(tmp_path, "[tool.s2sgrad]\nstandalone = true\n")
    config = load_config([source])
    assert config.standalone and config.options() == Options(standalone=True)
    assert config.override(standalone=False).options() == Options()


def test_unknown_key_names_the_file_and_the_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = error(tmp_path, "[tool.s2sgrad]\nfoo = 1\n")
    assert message.startswith("pyproject.toml: [tool.s2sgrad] unknown key 'foo'")


def test_unknown_key_suggests_the_spelling_it_resembles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = error(tmp_path, "[tool.s2sgrad]\nline_length = 100\n")
    assert message == (
        "pyproject.toml: [tool.s2sgrad] unknown key 'line_length'; "
        "did you mean 'line-length'?"
    )


@pytest.mark.parametrize(
    "line, expected",
    [
        ('line-length = "88"', "'line-length' must be an integer, got a string: '88'"),
        ("line-length = true", "'line-length' must be an integer, got a boolean: True"),
        ("line-length = 0", "'line-length' must be a positive integer, got 0"),
        (
            'include = "*.py"',
            "'include' must be a list of strings (globs), got a string",
        ),
        ("exclude = [1]", "'exclude' must be a list of strings (globs), got an array"),
        ("suffix = 1", "'suffix' must be a string, got an integer: 1"),
        ('suffix = "-grad"', "'suffix' must be a non-empty suffix of a module name"),
        ('policy = "fast"', "'policy' must be one of 'promote', 'first-order'"),
        (
            "output-dir = []",
            "'output-dir' must be a string (a directory), got an array",
        ),
        ("standalone = 1", "'standalone' must be true or false, got an integer: 1"),
        ('compile = "fast"', "'compile' must be true, false or \"strict\", got 'fast'"),
    ],
)
def test_wrong_type_or_value_names_the_file_and_the_key(
    tmp_path, monkeypatch, line, expected
):
    monkeypatch.chdir(tmp_path)
    message = error(tmp_path, f"[tool.s2sgrad]\n{line}\n")
    assert message.startswith("pyproject.toml: [tool.s2sgrad] ")
    assert expected in message


def test_invalid_toml_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path / "..")
    message = error(tmp_path, "[tool.s2sgrad\n")
    assert message.startswith(f"{tmp_path.name}/pyproject.toml: invalid TOML: ")


def s2sgrad(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "s2sgrad", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_cli_uses_the_file_and_flags_win(tmp_path):
    write_project(
        tmp_path,
        '[tool.s2sgrad]\nsuffix = "_lifted"\noutput-dir = "generated"\n'
        'policy = "first-order"\nexclude = ["skipped.py"]\n',
    )
    (tmp_path / "src" / "pkg" / "skipped.py").write_text(
        SQUARE.replace("square", "other")
    )
    run = s2sgrad("convert", "pkg", cwd=tmp_path / "src")  # below the root: walks up
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in (tmp_path / "generated").rglob("*.py")) == [
        "ops_lifted.py"
    ]
    assert (
        "@_FirstOrder(" in (tmp_path / "generated" / "ops_lifted.py").read_text()
    )
    run = s2sgrad(
        "convert",
        "src/pkg/ops.py",
        "-o",
        "out",
        "--suffix",
        "_grad",
        "--policy",
        "promote",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "_FirstOrder" not in (tmp_path / "out" / "ops_grad.py").read_text()


def test_cli_config_error_exits_2_naming_the_file_and_key(tmp_path):
    write_project(tmp_path, "[tool.s2sgrad]\nfoo = 1\n")
    run = s2sgrad("convert", "--check", "src", cwd=tmp_path)
    assert run.returncode == 2
    assert "pyproject.toml: [tool.s2sgrad] unknown key 'foo'" in run.stderr
    assert "Traceback" not in run.stderr
    assert not list(tmp_path.rglob("*_grad.py"))


def options_digest(path):
    """Return the options digest that the header of the generated module at `path` names."""
    return path.read_text().split(", options ", 1)[1].split(",", 1)[0]


@pytest.mark.parametrize(
    "table, flags, standalone",
    [
        ("", ["--standalone"], True),
        ("[tool.s2sgrad]\nstandalone = true\n", [], True),
        ("[tool.s2sgrad]\nstandalone = true\n", ["--no-standalone"], False),
        ("[tool.s2sgrad]\nstandalone = false\n", [], False),
    ],
)
def test_standalone_flag_and_key_reach_the_header(tmp_path, table, flags, standalone):
    write_project(tmp_path, table)
    run = s2sgrad("convert", "src/pkg/ops.py", *flags, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    digest = options_digest(tmp_path / "src" / "pkg" / "ops_grad.py")
    assert digest == Options(standalone=standalone).key()
    assert Options(standalone=True).key() != Options().key()


@pytest.mark.parametrize(
    "table, flags, mode",
    [
        ("", ["--compile"], True),
        ("", ["--compile-strict"], "strict"),
        ('[tool.s2sgrad]\ncompile = "strict"\n', [], "strict"),
        ('[tool.s2sgrad]\ncompile = "strict"\n', ["--no-compile"], False),
    ],
)
def test_compile_strict_flag_and_key_reach_the_generated_code(tmp_path, table, flags, mode):
    """`compile = "strict"` (or `--compile strict`) keeps the error where torch.compile
    fails, which `compile = true` turns into eager calls after one warning."""
    write_project(tmp_path, table)
    run = s2sgrad("convert", "src/pkg/ops.py", *flags, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    output = tmp_path / "src" / "pkg" / "ops_grad.py"
    assert options_digest(output) == Options(compile=mode).key()
    text = output.read_text()
    assert ("strict=True" in text) == (mode == "strict")
    assert ("_compiled(" in text) == bool(mode)
