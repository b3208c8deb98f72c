"""`[tool.s2sgrad]` in `pyproject.toml`: find it, parse it, check it.

Takes the paths given on the command line; returns a frozen `Config` (defaults where the
table or the file is absent). The file is the one in the project root, found by walking
up from the inputs to the first directory holding `pyproject.toml`, `.git` or `.hg` (as
black does). Invariant: every key is known and every value has its type, or
`ConfigError` names the file and the key; command-line flags are applied on top with
`Config.override`, never the other way round.

Light on purpose: `convert --check` reads the settings and the digest of the options
from a `Config`; `Options` (a dataclass, which loads `inspect`) is built only to convert.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from s2sgrad.header import options_key

if TYPE_CHECKING:
    from s2sgrad.options import Compile, Options, Policy

#: The values of `Policy`, in its order (tests/test_check_startup.py pins the two).
POLICIES = ("promote", "first-order", "recompute")
TABLE = "[tool.s2sgrad]"
_ROOT_MARKERS = ("pyproject.toml", ".git", ".hg")


class ConfigError(Exception):
    """A bad `pyproject.toml`: the message names the file and the key. `suffix` is
    the output suffix the file asks for as far as it can be read (the default where
    it says none, or no valid one), for the import hook to tell its names by."""

    def __init__(self, message: str, suffix: str = "_grad") -> None:
        super().__init__(message)
        self.suffix = suffix


class Config(NamedTuple):
    """Settings of a run: `[tool.s2sgrad]`, then the command line."""

    #: The `pyproject.toml` the settings came from, or None for the defaults.
    path: Path | None = None
    suffix: str = "_grad"
    #: Where outputs go (`-o`); None writes each beside its source.
    output_dir: Path | None = None
    policy: Policy = "promote"
    line_length: int = 88
    compile: Compile = False
    standalone: bool = False
    #: Globs that select files found in directories (not files named explicitly).
    include: tuple[str, ...] = ("*.py",)
    exclude: tuple[str, ...] = ()

    def options(self) -> Options:
        """Return the engine's options: the settings that change generated text."""
        from s2sgrad.options import Options

        return Options(**self._engine_settings())

    def options_key(self) -> str:
        """Return `self.options().key()`, without building the options."""
        return options_key(self._engine_settings())

    def _engine_settings(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "line_length": self.line_length,
            "suffix": self.suffix,
            "compile": self.compile,
            "standalone": self.standalone,
        }

    def override(self, **flags: Any) -> Config:
        """Return a copy with every flag that was given (not None) applied."""
        return self._replace(**{k: v for k, v in flags.items() if v is not None})

    def selects(self, file: Path) -> bool:
        """Tell whether `file`, found in a directory, is one to convert.

        Globs match the path relative to the project root (the folder of
        `pyproject.toml`) or the file name alone; `*` also matches `/`, as in fnmatch.
        """
        names = [file.name]
        if self.path is not None:
            try:
                names.append(
                    file.resolve().relative_to(self.path.parent.resolve()).as_posix()
                )
            except ValueError:
                pass

        def matches(globs: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(n, g) for n in names for g in globs)

        return matches(self.include) and not matches(self.exclude)


#: Key in `[tool.s2sgrad]` -> (Config field, expected type, description of the type).
_KEYS: dict[str, tuple[str, type, str]] = {
    "suffix": ("suffix", str, "a string"),
    "output-dir": ("output_dir", str, "a string (a directory)"),
    "policy": ("policy", str, "a string"),
    "line-length": ("line_length", int, "an integer"),
    "compile": ("compile", object, 'true, false or "strict"'),
    "standalone": ("standalone", bool, "true or false"),
    "include": ("include", list, "a list of strings (globs)"),
    "exclude": ("exclude", list, "a list of strings (globs)"),
}
assert {f for f, _, _ in _KEYS.values()} == set(Config._fields) - {"path"}


def project_root(paths: Sequence[Path]) -> Path:
    """Return the first folder above the inputs that holds a root marker, or `/`."""
    resolved = [p.resolve() for p in paths] or [Path.cwd().resolve()]
    common = Path(os.path.commonpath([str(p) for p in resolved]))
    start = common if common.is_dir() else common.parent
    for folder in (start, *start.parents):
        if marks_a_project(folder):
            return folder
    return Path(start.anchor)


def marks_a_project(folder: Path) -> bool:
    """Whether `folder` holds a project's root marker (`pyproject.toml`, `.git`)."""
    return any((folder / marker).exists() for marker in _ROOT_MARKERS)


def load_config(paths: Sequence[Path]) -> Config:
    """Return the settings of the project that holds `paths`."""
    pyproject = project_root(paths) / "pyproject.toml"
    if not pyproject.is_file():
        return Config()
    shown = _shown(pyproject)
    # Imported only where there is a file to parse: a `--check` is mostly start-up.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ConfigError(
                f"{shown}: reading it needs `tomli` on Python 3.10"
            ) from None
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: invalid TOML: {exc}") from None
    tool = data.get("tool", {})
    table = tool.get("s2sgrad") if isinstance(tool, dict) else None
    if table is None:
        return Config(path=pyproject)
    try:
        return parse_table(table, pyproject, shown)
    except ConfigError as exc:
        suffix = table.get("suffix") if isinstance(table, Mapping) else None
        if not isinstance(suffix, str) or suffix_problem(suffix):
            suffix = Config().suffix
        raise ConfigError(str(exc), suffix) from None


def parse_table(table: object, path: Path, shown: str) -> Config:
    """Check the `[tool.s2sgrad]` table of `path` and return its settings."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{shown}: {TABLE} must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in _KEYS:
            raise ConfigError(
                f"{shown}: {TABLE} unknown key {key!r}{_did_you_mean(key)}"
            )
        field, kind, described = _KEYS[key]
        wrong_type = not isinstance(value, kind) or (
            kind not in (bool, object) and isinstance(value, bool)
        )
        if wrong_type or (kind is list and not all(isinstance(v, str) for v in value)):
            raise ConfigError(
                f"{shown}: {TABLE} {key!r} must be {described}, "
                f"got {_toml_type(value)}: {value!r}"
            )
        values[field] = _checked(key, value, shown)
    if "output_dir" in values:
        values["output_dir"] = path.parent / values["output_dir"]
    for key in ("include", "exclude"):
        if key in values:
            values[key] = tuple(values[key])
    return Config(path=path, **values)


def suffix_problem(suffix: str) -> str | None:
    """What is wrong with `suffix` as the output module's suffix, or None: `X.py`
    becomes `X<suffix>.py`, which must be an importable module and never `X.py`."""
    if suffix and f"x{suffix}".isidentifier():
        return None
    return "must be a non-empty suffix of a module name, like '_grad'"


def _checked(key: str, value: Any, shown: str) -> Any:
    """Check the value of `key` beyond its type."""
    problem = None
    if key == "policy" and value not in POLICIES:
        choices = ", ".join(repr(p) for p in POLICIES)
        problem = f"must be one of {choices}"
    elif key == "line-length" and value < 1:
        problem = "must be a positive integer"
    elif key == "suffix" and suffix_problem(value):
        problem = suffix_problem(value)
    elif key == "output-dir" and not value:
        problem = "must name a directory"
    elif key == "compile" and not (isinstance(value, bool) or value == "strict"):
        problem = 'must be true, false or "strict"'
    if problem:
        raise ConfigError(f"{shown}: {TABLE} {key!r} {problem}, got {value!r}")
    return value


def _did_you_mean(key: str) -> str:
    close = difflib.get_close_matches(key.replace("_", "-"), _KEYS, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys: {', '.join(sorted(_KEYS))}"


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    names.update({list: "an array", dict: "a table"})
    return names.get(type(value), type(value).__name__)


def _shown(path: Path) -> str:
    try:
        return Path(os.path.relpath(path, Path.cwd())).as_posix()
    except ValueError:  # pragma: no cover - another drive on Windows
        return path.as_posix()
