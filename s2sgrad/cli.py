"""The command line: `s2sgrad convert PATH... [-o DIR] [--stdout]`.

This edge reads files, walks directories and writes outputs; the engine
(`s2sgrad.pipeline`) only maps text to text. Each file's outcome is a value; the
run writes only when every file converted, so an error leaves every output untouched.
Exit codes follow black: 0 done, 1 would change (`--check`), 2 input or usage error,
123 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from s2sgrad.codegen import Origin
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend import decode_source
from s2sgrad.options import Options
from s2sgrad.pipeline import convert, has_differentiators

EXIT_OK, EXIT_CHANGED, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 123
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "node_modules", "build", "dist"}


@dataclass(frozen=True)
class Converted:
    source: Path
    output: Path
    text: str


@dataclass(frozen=True)
class Failed:
    source: Path
    diagnostics: tuple[Diagnostic, ...]


Outcome = Converted | Failed


def module_name(path: Path) -> str:
    """Return the dotted name `path` is imported by, walking up `__init__.py` files."""
    parts = [path.stem]
    folder = path.resolve().parent
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def display_path(path: Path) -> str:
    """Return `path` relative to the working directory, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()


def _is_generated(path: Path, options: Options) -> bool:
    return path.stem.endswith(options.suffix)


def discover(
    paths: Sequence[Path], options: Options
) -> Iterator[tuple[Path, Path | None]]:
    """Yield (source, base directory or None for a file argument), sorted per argument."""
    for path in paths:
        if path.is_dir():
            for file in sorted(path.rglob("*.py")):
                rel = file.relative_to(path)
                if any(
                    part in _SKIP_DIRS or part.startswith(".")
                    for part in rel.parts[:-1]
                ):
                    continue
                if not _is_generated(file, options):
                    yield file, path
        else:
            yield path, None


def output_path(
    source: Path, base: Path | None, out_dir: Path | None, options: Options
) -> Path:
    name = f"{source.stem}{options.suffix}.py"
    if out_dir is None:
        return source.with_name(name)
    if base is None:
        return out_dir / name
    return out_dir / source.relative_to(base).parent / name


def convert_file(
    source: Path, output: Path, options: Options, explicit: bool
) -> Outcome | None:
    """Convert one file; None when a file found in a directory has no differentiators."""
    shown = display_path(source)
    try:
        data = source.read_bytes()
    except OSError as exc:
        return Failed(
            source, (Diagnostic("S2S004", f"cannot read: {exc.strerror}", shown, 1, 1),)
        )
    try:
        text = decode_source(data, shown)
        if not explicit and not has_differentiators(text, shown):
            return None
        return Converted(
            source, output, convert(text, Origin(shown, module_name(source)), options)
        )
    except TransformError as exc:
        return Failed(source, exc.diagnostics)


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def run_convert(args: argparse.Namespace) -> int:
    options = Options(policy=args.policy)
    out_dir = Path(args.output) if args.output else None
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(
            f"s2sgrad: error: no such file or directory: {missing[0]}", file=sys.stderr
        )
        return EXIT_ERROR
    outcomes: list[Outcome] = []
    for source, base in discover([Path(p) for p in args.paths], options):
        outcome = convert_file(
            source,
            output_path(source, base, out_dir, options),
            options,
            explicit=base is None,
        )
        if outcome is not None:
            outcomes.append(outcome)
    failed = [o for o in outcomes if isinstance(o, Failed)]
    for failure in failed:
        for diagnostic in failure.diagnostics:
            print(diagnostic.render(), file=sys.stderr)
    if failed:
        print(
            f"s2sgrad: {len(failed)} file(s) failed; nothing written", file=sys.stderr
        )
        return EXIT_ERROR
    done = [o for o in outcomes if isinstance(o, Converted)]
    if not done:
        print("s2sgrad: no differentiators found", file=sys.stderr)
        return EXIT_ERROR
    if args.stdout:
        sys.stdout.write("".join(o.text for o in done))
        return EXIT_OK
    for outcome in done:
        if _read_text(outcome.output) == outcome.text:
            print(f"unchanged {display_path(outcome.output)}", file=sys.stderr)
            continue
        write_atomic(outcome.output, outcome.text)
        print(f"wrote {display_path(outcome.output)}", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s2sgrad",
        description="Turn closure-style PyTorch gradient rules into autograd Functions.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert_cmd = commands.add_parser("convert", help="generate X_grad.py from X.py")
    convert_cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="files or directories"
    )
    convert_cmd.add_argument(
        "-o", "--output", metavar="DIR", help="write outputs under DIR"
    )
    convert_cmd.add_argument(
        "--stdout", action="store_true", help="print instead of writing"
    )
    convert_cmd.add_argument(
        "--policy",
        choices=["promote", "recompute", "first-order"],
        default="promote",
        help="how backward gets the gradients of captured temporaries: promote them "
        "(generated VJP, the default), recompute them in backward, or save them and "
        "make backward once_differentiable",
    )
    convert_cmd.set_defaults(run=run_convert)
    return parser


def report_internal_error(exc: BaseException) -> int:
    """Write the traceback to a file and say this is a bug in s2sgrad."""
    fd, path = tempfile.mkstemp(prefix="s2sgrad-internal-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("".join(traceback.format_exception(exc)))
    print(
        f"s2sgrad: internal error: {type(exc).__name__}: {exc}\n"
        f"This is a bug in s2sgrad, not in your code. The traceback is in {path}; "
        "please report it with the input that caused it.",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        result: int = args.run(args)
        return result
    except Exception as exc:  # noqa: BLE001 - anything unexpected is our bug
        return report_internal_error(exc)


if __name__ == "__main__":
    sys.exit(main())
