"""The command line: `s2sgrad convert PATH... [-o DIR] [--check] [--diff] [--stdout]
[-j N]` (`convert -` filters standard input to standard output), `s2sgrad review PATH...
[--html FILE] [-j N]`, `s2sgrad check PATH... [--order N]`, `s2sgrad run`; `--version`,
and `-q`/`-v` on every command.

This edge reads files, walks directories and writes outputs; the engine
(`s2sgrad.pipeline`) only maps text to text. Each file's outcome is a value, made in a
pool of worker processes (`-j`) or here, and only this process prints and writes, in
the order of the inputs, so a parallel run says and writes exactly what a serial one
does. The run writes only when every file converted, so an error leaves every output
untouched; a written file gets the mode an editor would give it.
Exit codes follow black: 0 done, 1 would change (`--check`) or a wrong gradient
(`check`), 2 input or usage error, 123 internal error; 141 where the reader of standard
output went away (`| head`), as for a shell pipeline's writer that SIGPIPE stopped.
"""

from __future__ import annotations

import argparse
import gc
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, NoReturn, TypeVar

import s2sgrad
from s2sgrad.config import (
    Config,
    ConfigError,
    load_config,
    marks_a_project,
    project_root,
)
from s2sgrad.header import Origin, generated_from, up_to_date
from s2sgrad.review.check import status, unified_diff
from s2sgrad.sources import decode_source, display_path, module_name, source_label

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from s2sgrad.diagnostics import Diagnostic
    from s2sgrad.options import Options
    from s2sgrad.review.model import ReviewRecord

# The engine (libcst, black) is imported where a file is converted or reviewed: a
# `--check` whose outputs are up to date answers from their headers without it, and is
# mostly start-up, so it imports little else either. Modules only some paths need
# (writing, the import hook, an internal error's report) are imported where used. The
# check reads its settings from `Config`, not `Options`, and reaches diagnostics through
# the package's lazy `s2sgrad.TransformError` and `s2sgrad.Diagnostic` (an `except`
# clause looks its class up only when an exception comes): both are dataclasses, and
# `dataclasses` loads `inspect`.

EXIT_OK, EXIT_CHANGED, EXIT_ERROR, EXIT_INTERNAL = 0, 1, 2, 123
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE's number
T = TypeVar("T")
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "node_modules", "build", "dist"}
#: Windows waits on at most 63 handles, so its pools take at most 61 workers (as black).
_MAX_WORKERS = 60 if sys.platform == "win32" else sys.maxsize


class Job(NamedTuple):
    """One selected file and where its output goes."""

    source: Path
    output: Path
    #: Named on the command line: it must hold differentiators. A file found in a
    #: directory that holds none is skipped instead.
    explicit: bool


class Converted(NamedTuple):
    source: Path
    output: Path
    text: str


class Failed(NamedTuple):
    source: Path
    diagnostics: tuple[Diagnostic, ...]


class Reviewed(NamedTuple):
    source: Path
    records: tuple[ReviewRecord, ...]


class Orphaned(NamedTuple):
    """An output s2sgrad wrote from a source that has no differentiators now."""

    source: Path
    output: Path


Outcome = Converted | Failed | Orphaned


def say(args: argparse.Namespace, message: str, level: int = 0) -> None:
    """Print an informational line to stderr: level 0 unless `-q`, 1 only with `-v`."""
    if getattr(args, "verbosity", 0) >= level:
        print(message, file=sys.stderr)


def _is_generated(path: Path, suffix: str) -> bool:
    return path.stem.endswith(suffix)


def discover(paths: Sequence[Path], suffix: str) -> Iterator[tuple[Path, Path | None]]:
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
                if not _is_generated(file, suffix):
                    yield file, path
        else:
            yield path, None


def output_path(
    source: Path, base: Path | None, out_dir: Path | None, suffix: str
) -> Path:
    name = f"{source.stem}{suffix}.py"
    if out_dir is None:
        return source.with_name(name)
    if base is None:
        return out_dir / name
    return out_dir / source.relative_to(base).parent / name


def convert_file(job: Job, options: Options) -> Outcome | None:
    """Convert one file; None when a file found in a directory has no differentiators.

    Runs in a worker process under `-j`: it only returns a value, never prints.
    """
    from s2sgrad.pipeline import convert, has_differentiators

    shown = display_path(job.source)
    try:
        text = read_source(job.source, shown)
        if not job.explicit and not has_differentiators(text, shown):
            return _orphaned(job)
        origin = Origin(source_label(job.source), module_name(job.source), shown)
        return Converted(job.source, job.output, convert(text, origin, options))
    except s2sgrad.TransformError as exc:
        return Failed(job.source, exc.diagnostics)


def vanished(args: argparse.Namespace, config: Config) -> list[Orphaned]:
    """The outputs s2sgrad wrote for a directory argument whose source file is gone:
    a file named like an output where that directory's outputs go, whose header says
    s2sgrad generated it, and whose source is in neither place it could be (under the
    directory argument, and where the header names it)."""
    found = []
    for argument in map(Path, args.paths):
        if not argument.is_dir():
            continue
        outputs = argument if config.output_dir is None else config.output_dir
        for output in sorted(outputs.rglob(f"*{config.suffix}.py")):
            rel = output.relative_to(outputs)
            if any(p in _SKIP_DIRS or p.startswith(".") for p in rel.parts[:-1]):
                continue
            stem = output.stem[: len(output.stem) - len(config.suffix)]
            source = argument / rel.parent / f"{stem}.py"
            if not stem or source.exists():
                continue
            text = _read_text(output)
            named = None if text is None else generated_from(text)
            if named is not None and not _named_source(argument, named).exists():
                found.append(Orphaned(source, output))
    return found


def _named_source(argument: Path, named: str) -> Path:
    """The source a generated module's header names, for the directory `argument`
    being converted: relative to the root of that directory's project, as
    `source_label` writes it, or to the working directory (outside a project, and in
    headers written before format 43). Not the output's project: an `-o` folder may
    lie outside any project (an outside probe found live outputs of another tree
    called gone there)."""
    root = project_root([argument])
    found = root / named
    return found if marks_a_project(root) and found.exists() else Path(named)


def _orphaned(job: Job) -> Orphaned | None:
    """`job`'s output where s2sgrad wrote one (its header says so) from a source found
    in a directory that has no differentiators now; None for a plain module."""
    on_disk = _read_text(job.output)
    if on_disk is None or generated_from(on_disk) is None:
        return None
    return Orphaned(job.source, job.output)


def up_to_date_output(job: Job, config: Config) -> Outcome | None:
    """Answer `--check` for one file without converting, or return None to convert it.

    An output whose header says it is what this source and these settings give (and
    whose body is what was written) is up to date. Cheap, so it runs in this process
    before any worker starts: a check of a tree that is up to date starts none, and
    builds no `Options`.
    """
    on_disk = _read_text(job.output)
    if on_disk is None:
        return None
    shown = display_path(job.source)
    try:
        text = read_source(job.source, shown)
    except s2sgrad.TransformError as exc:
        return Failed(job.source, exc.diagnostics)
    module = module_name(job.source)
    label = source_label(job.source)
    if up_to_date(on_disk, label, text, config.options_key(), module):
        return Converted(job.source, job.output, on_disk)
    return None


def review_file(job: Job, options: Options) -> Reviewed | Failed | None:
    """Review one file; None when a file found in a directory has no differentiators."""
    from s2sgrad.pipeline import has_differentiators
    from s2sgrad.review.model import review

    shown = display_path(job.source)
    try:
        text = read_source(job.source, shown)
        if not job.explicit and not has_differentiators(text, shown):
            return None
        origin = Origin(source_label(job.source), module_name(job.source), shown)
        records = review(text, origin, options, display_path(job.output))
        return Reviewed(job.source, tuple(records))
    except s2sgrad.TransformError as exc:
        return Failed(job.source, exc.diagnostics)


def read_source(source: Path, shown: str) -> str:
    """Return the text of `source`; raise `TransformError` when it cannot be read."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise s2sgrad.TransformError(
            [s2sgrad.Diagnostic("S2S004", f"cannot read: {exc.strerror}", shown, 1, 1)]
        ) from None
    return decode_source(data, shown)


def _unwritable(path: Path, text: str | None) -> str | None:
    """Why `path`, now holding `text` (None: no file read), cannot be written (None:
    it may be): checked for every output before any is written, so that a run that
    cannot finish writes nothing."""
    if path.is_dir():
        return "it is a directory"
    if text and generated_from(text) is None:
        return (
            "it exists, and s2sgrad did not write it (its first line is not an "
            "s2sgrad header): move it away, or choose another --suffix"
        )
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{display_path(folder)} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{display_path(folder)} is not writable"
    return None


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename.

    The file gets the mode an editor would give it: an existing output keeps its own,
    a new one gets 0o666 less the umask, which the kernel applies (with any default
    ACL) to the mode `os.open` asks for. (`mkstemp` would make it 0o600, unreadable to
    the group and to a build that runs as another user.) The temporary file is named
    after this process, so concurrent runs never share one; `O_EXCL` never writes
    through a file or link left at that name, which is removed first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        kept: int | None = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        kept = None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # left by a killed run that had this process id
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        with open(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        if kept is not None:
            os.chmod(tmp, kept)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _read_text(path: Path) -> str | None:
    try:  # exactly as on disk: CRLF line endings make an output stale
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def settings(args: argparse.Namespace) -> Config | None:
    """Return `[tool.s2sgrad]` with the flags applied; None after printing an error."""
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(
            f"s2sgrad: error: no such file or directory: {missing[0]}", file=sys.stderr
        )
        return None
    try:
        config = load_config([Path(p) for p in args.paths])
    except ConfigError as exc:
        print(f"s2sgrad: error: {exc}", file=sys.stderr)
        return None
    output = getattr(args, "output", None)
    return config.override(
        policy=args.policy,
        line_length=args.line_length,
        suffix=args.suffix,
        compile=args.compile,
        standalone=args.standalone,
        output_dir=Path(output) if output else None,
    )


def collect(
    args: argparse.Namespace,
    config: Config,
    handle: Callable[[Job, Options], T | Failed | None],
    shortcut: Callable[[Job, Config], T | Failed | None] | None = None,
    none_found: bool = False,
) -> list[T] | None:
    """Run `handle` on every selected file; None after printing the failures, or
    where no file has differentiators (unless `none_found` allows it).

    `shortcut`, when given, answers a file here first where it can (None: it cannot);
    only the rest go to `handle`, in worker processes under `-j`. Outcomes keep the
    order of the inputs whichever process made them. `Options` are built only for
    `handle`, when it has a file.
    """
    jobs = select(args, config)
    clash = _clashes(jobs)
    if clash:
        print(f"s2sgrad: error: {clash}; nothing written", file=sys.stderr)
        return None
    early = [shortcut(job, config) if shortcut else None for job in jobs]
    rest = [job for job, answer in zip(jobs, early, strict=True) if answer is None]
    late = iter(run_jobs(handle, rest, config.options(), args.workers) if rest else [])
    found = [next(late) if answer is None else answer for answer in early]
    outcomes = [o for o in found if o is not None]
    failed = [o for o in outcomes if isinstance(o, Failed)]
    for failure in failed:
        for diagnostic in failure.diagnostics:
            print(diagnostic.render(), file=sys.stderr)
    if failed:
        print(
            f"s2sgrad: {len(failed)} file(s) failed; nothing written", file=sys.stderr
        )
        return None
    if not outcomes and not none_found:
        print("s2sgrad: no differentiators found", file=sys.stderr)
        return None
    return [o for o in outcomes if not isinstance(o, Failed)]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def _clashes(jobs: Sequence[Job]) -> str | None:
    """Say where two sources would write one output, or an output is a source."""
    seen: dict[Path, Path] = {}
    sources = {job.source.resolve() for job in jobs}
    for job in jobs:
        output = job.output.resolve()
        if output in sources:
            return (
                f"the output of {display_path(job.source)} would be written over "
                f"{display_path(job.output)}, a source"
            )
        first = seen.get(output)
        if (
            first is not None
            and first != job.source.resolve()
            and _both_write(next(j for j in jobs if j.source.resolve() == first), job)
        ):
            return (
                f"{display_path(seen[output])} and {display_path(job.source)} would "
                f"both write {display_path(job.output)}; convert them in separate "
                "runs, or to separate output directories"
            )
        seen.setdefault(output, job.source.resolve())
    return None


def _both_write(first: Job, second: Job) -> bool:
    """Whether both jobs may write their output: a file found in a directory
    without differentiators writes nothing (two packages' `__init__.py`, converted
    into one output directory, are no clash)."""
    from s2sgrad.pipeline import has_differentiators

    for job in (first, second):
        if job.explicit:
            continue
        shown = display_path(job.source)
        try:
            if not has_differentiators(read_source(job.source, shown), shown):
                return False
        except (OSError, s2sgrad.TransformError):
            continue  # its conversion says what is wrong
    return True


def select(args: argparse.Namespace, config: Config) -> list[Job]:
    """Return a job for every file the arguments name or `[tool.s2sgrad]` selects,
    once each (`convert a.py a.py`, `convert . a.py`: the first naming counts)."""
    jobs: dict[Path, Job] = {}
    for source, base in discover([Path(p) for p in args.paths], config.suffix):
        if base is None or config.selects(source):
            output = output_path(source, base, config.output_dir, config.suffix)
            jobs.setdefault(source.resolve(), Job(source, output, base is None))
    return list(jobs.values())


def run_jobs(
    handle: Callable[[Job, Options], T],
    jobs: Sequence[Job],
    options: Options,
    workers: int,
) -> list[T]:
    """Return `handle`'s outcome for every job, in the order of `jobs`.

    Up to `workers` processes run at once, one task per file, as black does; outcomes
    are values sent back here. A worker's exception is raised here when its file's turn
    comes, as the serial loop would raise it, and the files not yet started are
    cancelled.
    """
    with _pool(min(workers, len(jobs), _MAX_WORKERS)) as pool:
        if pool is None and len(jobs) == 1 and workers > 1:
            # One file: its differentiators may take the cores the files would have.
            from s2sgrad.pipeline import PROCESSES

            token = PROCESSES.set(min(workers, _MAX_WORKERS))
            try:
                return [handle(jobs[0], options)]
            finally:
                PROCESSES.reset(token)
        if pool is None:
            return [handle(job, options) for job in jobs]
        futures = [pool.submit(handle, job, options) for job in jobs]
        return [future.result() for future in futures]


@contextmanager
def _pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """Yield a pool of `workers` processes, or None to run in this process.

    None for one worker (`-j 1`, or a single file: a process would only add its start),
    and where a pool cannot start: no working `/dev/shm` for its locks (AWS Lambda,
    some containers), or no `multiprocessing` at all (Termux, WASI, Emscripten).
    The conversion is the same either way, only slower.
    """
    if workers < 2:
        yield None
        return
    try:
        # Imported here: `--check` and one-file runs never start a pool, and the
        # import is a sixth of the CLI's start-up.
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=workers)
    except (ImportError, NotImplementedError, OSError):
        yield None
        return
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_convert(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if "-" in args.paths:
        return convert_stdin(args)
    if args.stdout and (args.check or args.diff):
        print(
            "s2sgrad: error: --stdout cannot be combined with --check or --diff",
            file=sys.stderr,
        )
        return EXIT_ERROR
    config = settings(args)
    shortcut = up_to_date_output if args.check and not args.diff else None
    gone = [] if config is None else vanished(args, config)
    done = None
    if config is not None:
        done = collect(args, config, convert_file, shortcut, bool(gone))
    if done is None:
        return EXIT_ERROR
    orphans = [*(o for o in done if isinstance(o, Orphaned)), *gone]
    converted = [o for o in done if isinstance(o, Converted)]
    for orphan in orphans:
        why = "has no differentiators now" if orphan.source.exists() else "is gone"
        print(
            f"s2sgrad: {display_path(orphan.output)} was generated from "
            f"{display_path(orphan.source)}, which {why}: delete it",
            file=sys.stderr,
        )
    if args.stdout:
        sys.stdout.write("".join(o.text for o in converted))
        return EXIT_OK
    if args.check or args.diff:
        changed = report_changes(args, converted, show_diff=args.diff)
        return EXIT_CHANGED if orphans else changed
    on_disk = [_read_text(o.output) for o in converted]
    blocked = [
        f"{display_path(o.output)}: {problem}"
        for o, text in zip(converted, on_disk, strict=True)
        if text != o.text and (problem := _unwritable(o.output, text))
    ]
    if blocked:
        for line in blocked:
            print(f"s2sgrad: error: cannot write {line}", file=sys.stderr)
        print("s2sgrad: nothing written", file=sys.stderr)
        return EXIT_ERROR
    for outcome, text in zip(converted, on_disk, strict=True):
        if text == outcome.text:
            say(args, f"unchanged {display_path(outcome.output)}")
            continue
        try:
            write_atomic(outcome.output, outcome.text)
        except OSError as exc:
            print(
                f"s2sgrad: error: cannot write {display_path(outcome.output)}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        say(args, f"wrote {display_path(outcome.output)}")
    lines = sum(o.text.count("\n") for o in converted)
    took = time.perf_counter() - start
    say(
        args,
        f"s2sgrad: {len(converted)} file(s), {lines} generated lines in {took:.2f} s",
        1,
    )
    return EXIT_OK


def convert_stdin(args: argparse.Namespace) -> int:
    """`convert -`: the source from standard input, the module to standard output."""
    if args.paths != ["-"] or args.check or args.diff or args.output:
        print(
            "s2sgrad: error: `-` (standard input) goes alone, without --check, --diff "
            "or -o",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        config = load_config([Path.cwd()])
    except ConfigError as exc:
        print(f"s2sgrad: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    options = config.override(
        policy=args.policy,
        line_length=args.line_length,
        suffix=args.suffix,
        compile=args.compile,
        standalone=args.standalone,
    ).options()
    from s2sgrad.pipeline import convert

    try:
        text = decode_source(sys.stdin.buffer.read(), "<stdin>")
        sys.stdout.write(convert(text, Origin("<stdin>", None), options))
    except s2sgrad.TransformError as exc:
        for diagnostic in exc.diagnostics:
            print(diagnostic.render(), file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def report_changes(
    args: argparse.Namespace, done: Sequence[Converted], show_diff: bool
) -> int:
    """List each stale or missing output (and its diff); write nothing."""
    changed = 0
    for outcome in done:
        on_disk = _read_text(outcome.output)
        state = status(on_disk, outcome.text)
        if state == "unchanged":
            continue
        changed += 1
        shown = display_path(outcome.output)
        if show_diff:
            sys.stdout.write(unified_diff(on_disk, outcome.text, shown))
        verb = "create" if state == "missing" else "update"
        print(f"would {verb} {shown} ({state})", file=sys.stderr)
    if changed:
        say(
            args,
            f"s2sgrad: {changed} of {len(done)} output(s) would change; "
            "run `s2sgrad convert` to update them",
        )
        return EXIT_CHANGED
    say(args, f"s2sgrad: {len(done)} output(s) up to date")
    return EXIT_OK


def run_review(args: argparse.Namespace) -> int:
    config = settings(args)
    reviewed = None if config is None else collect(args, config, review_file)
    if reviewed is None:
        return EXIT_ERROR
    records = [record for outcome in reviewed for record in outcome.records]
    if args.html:
        page = Path(args.html)
        if page.is_dir() or any(_same_file(page, o.source) for o in reviewed):
            what = "a directory" if page.is_dir() else "a source it reviews"
            print(
                f"s2sgrad: error: --html {args.html} is {what}; name a new file, "
                "like review.html",
                file=sys.stderr,
            )
            return EXIT_ERROR
        title = ", ".join(display_path(o.source) for o in reviewed)
        from s2sgrad.review.page import render_html

        try:
            write_atomic(page, render_html(records, title))
        except OSError as exc:
            print(
                f"s2sgrad: error: cannot write {args.html}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        say(args, f"wrote {display_path(Path(args.html))}")
        return EXIT_OK
    import shutil

    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    width = shutil.get_terminal_size().columns
    from s2sgrad.review.text import render_text

    sys.stdout.write(render_text(records, width, color))
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    """`s2sgrad check`: each differentiator with example inputs against torch.autograd
    through its own forward (see s2sgrad.testing)."""
    config = settings(args)
    if config is None:
        return EXIT_ERROR
    options = config.options()
    from s2sgrad.pipeline import differentiator_names
    from s2sgrad.testing import check_module

    counts = {"ok": 0, "wrong": 0, "no examples": 0, "error": 0}
    sources = [s for s, _ in discover([Path(p) for p in args.paths], options.suffix)]
    unread = 0  # files that could not be read or parsed: each is reported, in order
    for source in sources:
        shown = display_path(source)
        try:
            names = differentiator_names(read_source(source, shown), shown)
        except s2sgrad.TransformError as exc:
            for diagnostic in exc.diagnostics:
                print(diagnostic.render(), file=sys.stderr)
            unread += 1
            continue
        if not names:
            continue
        started = time.perf_counter()
        try:
            module = _import_path(source)
            found = check_module(module, names, args.order, options)
        except (ImportError, ValueError, s2sgrad.TransformError) as exc:
            text = (
                "\n".join(d.render() for d in exc.diagnostics)
                if isinstance(exc, s2sgrad.TransformError)
                else f"s2sgrad: error: {shown}: {exc}"
            )
            print(text, file=sys.stderr)
            return EXIT_ERROR
        took = time.perf_counter() - started
        for checked in found:
            counts[checked.status] += 1
            line = f"{checked.status:<11} {shown}::{checked.name}"
            if checked.status in ("wrong", "error"):
                print(f"{line}\n{_indent(checked.report)}")
            elif args.verbosity >= 0:
                print(f"{line} ({checked.report})" if checked.report else line)
        say(args, f"{shown}: {len(found)} differentiator(s) in {took:.1f} s", 1)
    if unread:
        print(f"s2sgrad: {unread} file(s) failed", file=sys.stderr)
        return EXIT_ERROR
    if not any(counts.values()):
        print("s2sgrad: no differentiators found", file=sys.stderr)
        return EXIT_ERROR
    summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
    say(args, f"s2sgrad: {summary} (gradients up to order {args.order})")
    if counts["error"]:
        return EXIT_ERROR
    return EXIT_CHANGED if counts["wrong"] else EXIT_OK


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.splitlines()).rstrip("\n")


def _import_path(source: Path) -> object:
    """Import the module at `source` by its dotted name, its package root on sys.path."""
    import importlib

    name = module_name(source)
    root = source.resolve().parents[name.count(".")]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(name)


def _suffix(text: str) -> str:
    from s2sgrad.config import suffix_problem

    problem = suffix_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
    return text


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def _engine_flags() -> argparse.ArgumentParser:
    """Flags that change the generated code; they override `[tool.s2sgrad]`."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--policy",
        choices=["promote", "recompute", "first-order"],
        help="how backward gets the gradients of captured temporaries: promote them "
        "(generated VJP, the default), recompute them in backward, or save them and "
        "take first derivatives only (a second-order use raises)",
    )
    flags.add_argument(
        "--line-length",
        type=_positive,
        metavar="N",
        help="line length of the generated code (default 88)",
    )
    flags.add_argument(
        "--suffix",
        type=_suffix,
        help="output module suffix: X.py -> X<SUFFIX>.py (default _grad)",
    )
    flags.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run each Function's f_forward and f_backward compiled by inductor "
        "(double backward stays right; a call torch.compile cannot handle runs "
        "eagerly after one warning); --no-compile overrides `compile = true`",
    )
    flags.add_argument(
        "--compile-strict",
        dest="compile",
        action="store_const",
        const="strict",
        help="--compile, where a call torch.compile cannot handle is an error",
    )
    flags.add_argument(
        "--standalone",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="copy the parts of s2sgrad.runtime the module uses into it, so that it "
        "runs where s2sgrad is not installed; --no-standalone overrides "
        "`standalone = true`",
    )
    return flags


def _workers() -> argparse.ArgumentParser:
    """`-j N`, for the commands that handle files one by one."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "-j",
        "--workers",
        type=_positive,
        default=os.cpu_count() or 1,
        metavar="N",
        help="handle up to N files at once, in worker processes (default: the "
        "number of CPUs; 1 runs in this process)",
    )
    return flags


def _manners(default: object) -> argparse.ArgumentParser:
    """`-q` and `-v`, on the program and on each command (whose defaults leave the
    program's value alone)."""
    flags = argparse.ArgumentParser(add_help=False)
    group = flags.add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        default=default,
        help="print errors and findings only",
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        default=default,
        help="say more (timings; for run, each import decision)",
    )
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="s2sgrad",
        description="Turn closure-style PyTorch gradient rules into autograd Functions.",
        parents=[_manners(0)],
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {s2sgrad.__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    flags = _engine_flags()
    manners = _manners(argparse.SUPPRESS)
    workers = _workers()
    convert_cmd = commands.add_parser(
        "convert",
        help="generate X_grad.py from X.py",
        parents=[flags, workers, manners],
    )
    convert_cmd.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or directories; `-` reads standard input and writes standard output",
    )
    convert_cmd.add_argument(
        "-o", "--output", metavar="DIR", help="write outputs under DIR"
    )
    convert_cmd.add_argument(
        "--stdout", action="store_true", help="print instead of writing"
    )
    convert_cmd.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing each stale or missing output",
    )
    convert_cmd.add_argument(
        "--diff",
        action="store_true",
        help="write nothing; print a unified diff of what would change, exit 1 if any",
    )
    convert_cmd.set_defaults(run=run_convert)
    review_cmd = commands.add_parser(
        "review",
        help="show each differentiator beside its generated code, with its captures",
        parents=[flags, workers, manners],
    )
    review_cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="files or directories"
    )
    review_cmd.add_argument(
        "--html", metavar="FILE", help="write a self-contained HTML page to FILE"
    )
    review_cmd.set_defaults(run=run_review)
    check_cmd = commands.add_parser(
        "check",
        help="check each differentiator that has example inputs (S2SGRAD_EXAMPLES) "
        "against torch.autograd through its own forward",
        parents=[flags, manners],
    )
    check_cmd.add_argument(
        "paths", nargs="+", metavar="PATH", help="files or directories"
    )
    check_cmd.add_argument(
        "--order",
        type=_positive,
        default=2,
        metavar="N",
        help="check the generated op's gradients up to order N (default 2)",
    )
    check_cmd.set_defaults(run=run_check)
    run_cmd = commands.add_parser(
        "run",
        help="run script.py or -m module with the import hook installed "
        "(s2sgrad's own -q/-v go before `run`)",
        prefix_chars="+",  # so that `-m` and every later argument reach the program
        add_help=False,
    )
    run_cmd.add_argument(
        "argv", nargs=argparse.REMAINDER, metavar="script.py | -m module [args]"
    )
    run_cmd.set_defaults(run=run_command)
    return parser


def run_command(args: argparse.Namespace) -> int:
    """`s2sgrad run`: the import hook's command, loaded only to run it."""
    from s2sgrad.hook import run_command as run_with_hook

    return run_with_hook(args)


def _run_manners(args: argparse.Namespace) -> None:
    """`run`'s own -q/-v: before the program (`s2sgrad -v run x.py`, or right after
    `run`); -v logs each import decision, -q silences stale-output warnings."""
    while args.argv[:1] and args.argv[0] in ("-q", "--quiet", "-v", "--verbose"):
        args.verbosity = 1 if args.argv.pop(0) in ("-v", "--verbose") else -1
    if args.verbosity > 0:
        os.environ["S2SGRAD_TRACE"] = "1"
    elif args.verbosity < 0:
        import warnings

        from s2sgrad.hook import StaleGeneratedCodeWarning

        warnings.filterwarnings("ignore", category=StaleGeneratedCodeWarning)


def report_internal_error(exc: BaseException) -> int:
    """Write the traceback to a file and say this is a bug in s2sgrad."""
    import tempfile
    import traceback

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


def _collect_rarely() -> None:
    """Run the garbage collector's passes rarely in a process that only converts.

    Conversion makes many objects and few cycles (libcst's and black's trees hold
    none), and each pass of the collector walks the heap the analysis has built: at
    CPython's default threshold they took about a tenth of a large module's
    conversion. The process ends, or its workers do, when the files are done; what
    is already loaded (the engine) is left out of the passes altogether. Not for
    `run` and `check`, which run the user's code.
    """
    gc.freeze()
    gc.set_threshold(100_000)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(argv)[0]


def command_line() -> NoReturn:
    """The `s2sgrad` command (and `python -m s2sgrad`): `main` on `sys.argv`.

    Where `convert` or `review` ran, nothing is left to do once the files are
    written and the report is out, and the process ends at once: the interpreter's
    teardown frees every object the conversion built, a few percent of converting a
    large module, for nothing (mypy ends the same way). Not after `check` and
    `run`, which ran the user's code: its `atexit` functions and open files are
    kept as Python keeps them.
    """
    code, converting = _main(None)
    if converting:
        _end_at_once(code)
    sys.exit(code)


def _end_at_once(code: int) -> NoReturn:
    """End the process with `code` now, after writing out what stdout and stderr
    hold (a reader that closed the pipe, `| head`, changes nothing: the code
    stands)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a closed stream
            pass
    os._exit(code)


def _main(argv: Sequence[str] | None) -> tuple[int, bool]:
    """`main`'s exit code, and whether this process only converted (the command
    line's own process ran `convert` or `review`)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0), False
    converting = args.command in ("convert", "review") and argv is None
    if args.command == "run":
        _run_manners(args)
    elif converting:
        _collect_rarely()  # the command line's own process, not a caller's
    try:
        result: int = args.run(args)
        return result, converting
    except BrokenPipeError:
        # `s2sgrad convert --diff | head`: the reader has what it wanted. Python
        # flushes standard output at exit, which would fail again: point it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE, converting
    except Exception as exc:  # noqa: BLE001 - anything unexpected is our bug
        return report_internal_error(exc), converting


if __name__ == "__main__":
    command_line()
