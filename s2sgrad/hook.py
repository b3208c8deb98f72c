"""The import hook: `import pkg.ops_grad` served from `pkg/ops.py`, no file needed.

Takes an import of a name ending in the options' suffix (`_grad`) whose source `ops.py`
is on the path; returns the module that `s2sgrad convert pkg/ops.py`, run from the
working directory, would write, made by the same `pipeline.convert` call, so the two
texts are byte-identical. Invariant: what is served matches the source on disk at
import time. A checked-in `ops_grad.py` is imported as is only when the source hash in
its header matches `ops.py`; a cache entry is used only when the key stored inside it
(source sha256, s2sgrad version, format, options, origin, interpreter) equals
the key computed now, never by modification time. Any `OSError` on the cache is a miss,
a transform error is a `TransformImportError`, and nothing ever falls back silently.

This is an edge: it reads sources, caches and `S2SGRAD_TRACE` (=1 logs each decision
to stderr). The CLI's `run` command lives here too, as it only installs the hook.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import marshal
import os
import runpy
import stat
import sys
import traceback
import warnings
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, ModuleType, TracebackType
from typing import TYPE_CHECKING

import s2sgrad
from s2sgrad.config import ConfigError, load_config
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.files import write_atomic
from s2sgrad.header import FORMAT_VERSION, HASH_MARK, Origin, source_hash
from s2sgrad.lines import split_lines
from s2sgrad.options import Options
from s2sgrad.sources import display_path, module_name, source_label

if TYPE_CHECKING:
    import argparse

# `find_spec` reads `[tool.s2sgrad]` with `load_config`, which imports its TOML parser
# only where it finds a file (to keep `convert --check` fast). The hook imports it now:
# an import made inside `find_spec` would come back to it before it knows its options.
if sys.version_info >= (3, 11):
    import tomllib  # noqa: F401
else:  # pragma: no cover - Python 3.10
    try:
        import tomli  # noqa: F401
    except ImportError:
        pass

#: Opens every cache entry; bump the number when the entry layout changes.
ENTRY_MAGIC = b"s2sgrad-cache 1\n"
_HEADER_LINES = 8  # the hash mark sits in the first lines of a generated module


class StaleGeneratedCodeWarning(UserWarning):
    """A generated module on disk does not match its source; a fresh one is served."""


class TransformImportError(ImportError):
    """The source of a generated module has errors; `.diagnostics` locates each one."""

    def __init__(
        self, diagnostics: Sequence[Diagnostic], name: str, path: Path
    ) -> None:
        message = "\n".join(d.render() for d in diagnostics)
        super().__init__(message, name=name, path=str(path))
        self.diagnostics = tuple(diagnostics)


@dataclass(frozen=True)
class Job:
    """One generated module to serve: everything its text and cache entry depend on."""

    name: str  # the generated module's dotted name
    source: Path
    data: bytes  # the source as read once; every later step uses these bytes
    origin: Origin
    options: Options
    entry: Path | None  # the cache entry, None when the interpreter has no cache tag
    listing: Path  # the generated text's file, named in tracebacks and `__file__`

    def key(self) -> str:
        """Return the digest of everything the served code depends on."""
        parts = [
            hashlib.sha256(self.data).hexdigest(),
            s2sgrad.__version__,
            str(FORMAT_VERSION),
            self.options.key(),
            str(sys.implementation.cache_tag),
            str(sys.flags.optimize),  # `compile` strips asserts under -O
            self.origin.display_path,
            self.origin.module_name or "",
        ]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class Built:
    """A generated module's text and the code compiled from it."""

    text: str
    code: CodeType


def trace(name: str, message: str) -> None:
    """Log one decision about `name` to stderr when `S2SGRAD_TRACE=1`."""
    if os.environ.get("S2SGRAD_TRACE") == "1":
        print(f"s2sgrad: import {name}: {message}", file=sys.stderr)


class GeneratedLoader(importlib.abc.InspectLoader):
    """Execute a generated module, building it (or reading its cache) on first use."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._built: Built | None = None

    def is_package(self, fullname: str) -> bool:
        return False

    def get_source(self, fullname: str) -> str:
        return self._build().text

    def get_code(self, fullname: str) -> CodeType:
        return self._build().code

    def _build(self) -> Built:
        if self._built is None:
            self._built = build(self.job)
            text = self._built.text
            lines = split_lines(text, keepends=True)
            # mtime None: linecache.checkcache keeps it, file or not
            listing = str(self.job.listing)
            linecache.cache[listing] = (len(text), None, lines, listing)
        return self._built


class ImportHook(importlib.abc.MetaPathFinder):
    """The finder `install_import_hook` puts first on `sys.meta_path`.

    Use it as a context manager, or call `uninstall`, to remove it again.
    """

    def __init__(self, packages: Iterable[str] | None, options: Options | None) -> None:
        self.packages = None if packages is None else tuple(packages)
        #: Explicit options, or None to read each source's `[tool.s2sgrad]` as the CLI does.
        self.options = options

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        try:
            suffix = self._suffix(fullname, path)
        except _TableError as error:
            if self.packages is not None and not self._near(fullname):
                return None  # not the hook's to serve: a bad table breaks it not
            last = fullname.rpartition(".")[2]
            if not last.endswith(error.suffix) or last == error.suffix:
                # `decimal`, the package itself, an optional import that expects
                # ModuleNotFoundError: no output's name by the suffix the table
                # asks for, as far as it can be read.
                return None
            raise
        if suffix is None:
            return None
        source_name = fullname[: -len(suffix)]
        if not source_name or source_name.endswith("."):
            return None
        if not self._selected(source_name):
            trace(
                fullname, f"skipped: {source_name} is outside packages {self.packages}"
            )
            return None
        on_disk = importlib.machinery.PathFinder.find_spec(fullname, path)
        if on_disk is not None:
            source = _source_beside(on_disk, suffix)
            if source is None:
                trace(fullname, f"skipped: {on_disk.origin} has no source beside it")
                return None
        else:
            source = _find_source(source_name, path)
            if source is None:
                trace(fullname, f"skipped: no source for {source_name} on the path")
                return None
        return spec_for(
            fullname, source, self.options or project_options(source.parent)
        )

    def _suffix(self, fullname: str, path: Sequence[str] | None) -> str | None:
        """The suffix `fullname` ends with, of the options that serve it: explicit
        ones, else those of the project holding its package's folders (a submodule:
        `path`), else, for a top-level module, of the working directory's project."""
        if self.options is not None:
            found = [self.options.suffix]
        elif path is not None:
            found = [project_options(Path(folder)).suffix for folder in path]
        else:
            found = [project_options(Path.cwd()).suffix]
        last = fullname.rpartition(".")[2]
        return next((x for x in found if last.endswith(x) and last != x), None)

    def _near(self, fullname: str) -> bool:
        """Whether `fullname` may be an output of a source in the packages: its
        top-level name starts with one of theirs (`plain_grad` with `plain`), as a
        suffix only lengthens the last name."""
        top = fullname.partition(".")[0]
        return any(top.startswith(p.partition(".")[0]) for p in self.packages or ())

    def _selected(self, source_name: str) -> bool:
        if self.packages is None:
            return True
        return any(
            source_name == p or source_name.startswith(p + ".") for p in self.packages
        )

    def uninstall(self) -> None:
        """Remove this hook from `sys.meta_path`; modules already imported stay."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def __enter__(self) -> ImportHook:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()


@functools.lru_cache(maxsize=256)
def project_options(folder: Path) -> Options:
    """Return the options `s2sgrad convert` would use for sources in `folder`.

    They come from `[tool.s2sgrad]` of the project holding the folder, so the hook serves
    the same bytes the CLI writes. A bad configuration is an import error, never ignored.
    """
    try:
        return load_config([folder]).options()
    except ConfigError as exc:
        raise _TableError(f"s2sgrad: {exc}", exc.suffix) from None


class _TableError(ImportError):
    """A bad `[tool.s2sgrad]` met by an import, with the suffix it asks for."""

    def __init__(self, message: str, suffix: str) -> None:
        super().__init__(message)
        self.suffix = suffix


def install_import_hook(
    packages: Iterable[str] | None = None, *, options: Options | None = None
) -> ImportHook:
    """Serve `X_grad` modules generated from `X.py`, in `packages` or everywhere.

    `packages` names the source modules or packages (`"pkg"` covers `pkg.ops_grad` and
    `pkg.sub.ops_grad`); None means any. Returns the hook: call `uninstall()` on it, or
    use it as a context manager.
    """
    if isinstance(packages, str):
        packages = [packages]
    hook = ImportHook(packages, options)
    sys.meta_path.insert(0, hook)
    return hook


def load(path: str | os.PathLike[str], *, options: Options | None = None) -> ModuleType:
    """Import the generated module of the source file `path`, as the hook would.

    The module is registered in `sys.modules` under its dotted name, so that pickling
    and `torch.compile` find it.
    """
    source = Path(path).resolve()
    options = options or project_options(source.parent)
    name = module_name(source) + options.suffix
    spec = spec_for(name, source, options)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        assert spec.loader is not None  # both kinds of spec carry one
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def spec_for(
    name: str, source: Path, options: Options
) -> importlib.machinery.ModuleSpec:
    """Return the spec of `name`: the file beside `source` if fresh, else generated."""
    grad = source.with_name(f"{source.stem}{options.suffix}.py")
    data = _read_source(name, source)
    recorded = _recorded_hash(grad)
    if recorded is None:
        trace(name, f"serving a module generated from {source}")
        return _generated_spec(name, source, data, grad, options)
    if recorded == "":
        trace(name, f"skipped: {grad} is not generated by s2sgrad; importing it as is")
    elif recorded == _text_hash(data):
        trace(name, f"up to date: importing {grad} as is")
    else:
        message = (
            f"{grad} is stale: it was generated from another version of {source}; "
            f"serving a fresh module instead (run `s2sgrad convert {source}` to update)"
        )
        trace(name, f"stale: {message}")
        warnings.warn(message, StaleGeneratedCodeWarning, stacklevel=3)
        return _generated_spec(name, source, data, grad, options)
    spec = importlib.util.spec_from_file_location(name, grad)
    assert spec is not None  # a `.py` path always has a spec
    return spec


def _generated_spec(
    name: str, source: Path, data: bytes, grad: Path, options: Options
) -> importlib.machinery.ModuleSpec:
    # The name the module is imported by says what the source's is, in a namespace
    # package too (a folder without `__init__.py`), where `module_name` stops short.
    origin = Origin(
        source_label(source), name.removesuffix(options.suffix), display_path(source)
    )
    entry, listing = _cache_files(grad)
    job = Job(name, source, data, origin, options, entry, listing)
    spec = importlib.machinery.ModuleSpec(
        name, GeneratedLoader(job), origin=str(listing)
    )
    spec.has_location = True
    spec.cached = None if entry is None else str(entry)
    return spec


def _source_beside(spec: importlib.machinery.ModuleSpec, suffix: str) -> Path | None:
    """Return `X.py` beside the module file `X_grad.py` that `spec` found, if any."""
    if spec.origin is None or not spec.origin.endswith(f"{suffix}.py"):
        return None
    grad = Path(spec.origin)
    source = grad.with_name(grad.name[: -len(f"{suffix}.py")] + ".py")
    return source if source.is_file() else None


def _find_source(name: str, path: Sequence[str] | None) -> Path | None:
    """Return the `.py` file that `name` imports from, if it is a plain module."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or not isinstance(
        spec.loader, importlib.machinery.SourceFileLoader
    ):
        return None
    origin = Path(str(spec.origin))
    return None if origin.name == "__init__.py" else origin


def _read_source(name: str, source: Path) -> bytes:
    try:
        return source.read_bytes()
    except OSError as exc:
        message = f"cannot read: {exc.strerror}"
        diagnostic = Diagnostic("S2S004", message, display_path(source), 1, 1)
        raise TransformImportError([diagnostic], name, source) from None


def _recorded_hash(grad: Path) -> str | None:
    """Return the source hash in `grad`'s header: "" if none, None if unreadable."""
    try:
        with grad.open(encoding="utf-8", errors="replace") as handle:
            head = [handle.readline() for _ in range(_HEADER_LINES)]
    except OSError:
        return None
    for line in head:
        if line.startswith(HASH_MARK):
            return line[len(HASH_MARK) :].strip()
    return ""


def _text_hash(data: bytes) -> str:
    """Return the hash a generated header records for the source `data`."""
    try:
        from s2sgrad.sources import decode_source

        return source_hash(decode_source(data, ""))
    except TransformError:
        return ""  # undecodable: nothing generated from it can match


def _cache_files(grad: Path) -> tuple[Path | None, Path]:
    """Return the cache entry and the listing of `grad`, in its `__pycache__`.

    `cache_from_source` puts them where `.pyc` files go, so `sys.pycache_prefix` holds.
    """
    tag = sys.implementation.cache_tag
    if tag is None:
        return None, grad.with_name(f"{grad.stem}.s2sgrad.py")
    folder = Path(importlib.util.cache_from_source(str(grad))).parent
    return folder / f"{grad.stem}.{tag}.s2sgrad", folder / f"{grad.stem}.s2sgrad.py"


def build(job: Job) -> Built:
    """Return the module of `job` from its cache entry, or generate and cache it."""
    key = job.key()
    if job.entry is not None:
        cached = read_entry(job.entry, key)
        if isinstance(cached, Built):
            trace(job.name, f"cache hit: {job.entry}")
            return cached
        trace(job.name, f"cache miss: {cached}; generating from {job.source}")
    text = generate(job)
    code = compile(text, str(job.listing), "exec", dont_inherit=True)
    built = Built(text, code)
    if job.entry is not None:
        save(job, key, built)
    return built


def generate(job: Job) -> str:
    """Return the module text, by the code path of `s2sgrad convert`."""
    try:
        from s2sgrad.pipeline import convert
        from s2sgrad.sources import decode_source

        text = decode_source(job.data, job.origin.where)
        return convert(text, job.origin, job.options)
    except TransformError as exc:
        trace(job.name, f"transform error in {job.source}")
        raise TransformImportError(exc.diagnostics, job.name, job.source) from None


def read_entry(entry: Path, key: str) -> Built | str:
    """Return the cached module, or why the entry cannot be used."""
    try:
        blob = entry.read_bytes()
    except OSError as exc:
        return f"cannot read {entry} ({exc.strerror})"
    head = ENTRY_MAGIC + key.encode() + b"\n"
    if not blob.startswith(ENTRY_MAGIC):
        return f"{entry} is not an s2sgrad cache entry"
    if not blob.startswith(head):
        return f"{entry} is for another source, version or options"
    checksum, payload = blob[len(head) : len(head) + 9], blob[len(head) + 9 :]
    if _checksum(payload) != checksum:
        return f"{entry} is truncated or corrupt"
    try:
        text, code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return f"{entry} does not unmarshal"
    if not isinstance(text, str) or not isinstance(code, CodeType):
        return f"{entry} holds something else"
    return Built(text, code)


def _checksum(payload: bytes) -> bytes:
    """Return the entry's check line: a torn or damaged payload fails it.

    CRC-32, not a cryptographic hash: the key already names the source, and this only
    has to catch damage, at a fraction of sha256's cost on every import.
    """
    return b"%08x\n" % zlib.crc32(payload)


def save(job: Job, key: str, built: Built) -> None:
    """Write the listing, then the entry, each atomically; failing to is only a miss."""
    assert job.entry is not None
    if sys.dont_write_bytecode:
        trace(job.name, "not cached: sys.dont_write_bytecode is set")
        return
    payload = marshal.dumps((built.text, built.code))
    blob = ENTRY_MAGIC + key.encode() + b"\n" + _checksum(payload) + payload
    try:
        mode = _cache_mode(job.source)
        job.entry.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(job.listing, built.text.encode("utf-8"), mode)
        write_atomic(job.entry, blob, mode)
    except OSError as exc:
        trace(job.name, f"not cached: {exc}")
        return
    trace(job.name, f"cached in {job.entry}")


def _cache_mode(source: Path) -> int:
    """Return the mode to create cache files with: the source's, as `.pyc` files get.

    Both hold the source's code, so a source others may not read (0o600) must not
    leak through a world-readable cache beside it. Owner-writable always, so the next
    import can replace an entry of a read-only source (importlib's `_calc_mode`).
    """
    return (stat.S_IMODE(source.stat().st_mode) | 0o200) & 0o666


_RUN_USAGE = "usage: s2sgrad run script.py [args...] | s2sgrad run -m module [args...]"


def run_command(args: argparse.Namespace) -> int:
    """Run a script or module as `python` would, with the import hook installed."""
    argv: list[str] = args.argv
    if argv[:1] in (["-h"], ["--help"]):
        print(_RUN_USAGE)
        return 0
    if not argv or argv == ["-m"] or (argv[0].startswith("-") and argv[0] != "-m"):
        print(_RUN_USAGE, file=sys.stderr)
        return 2
    if argv[0] != "-m" and not os.path.isfile(argv[0]):
        print(f"s2sgrad run: can't open file {argv[0]!r}", file=sys.stderr)
        return 2
    install_import_hook()
    try:
        _run(argv)
    except Exception as exc:  # noqa: BLE001 - the program's own error
        _print_program_error(exc)
        return 1
    return 0


def _run(argv: list[str]) -> None:
    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


def _print_program_error(exc: Exception) -> None:
    """Print the traceback from the program's own frames on, as python does.

    Printed by the `traceback` module, which reads lines through `linecache`, so a
    generated module shows its lines even where its listing could not be written
    (python's built-in printer reads only files). A transform error also drops the
    hook's frames: its diagnostics say where the error is.
    """
    if sys.excepthook is not sys.__excepthook__:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        return
    report = traceback.TracebackException.from_exception(exc)
    frames = list(report.stack)
    ours = {__file__, runpy.run_path.__code__.co_filename}
    while frames and frames[0].filename in ours:
        frames.pop(0)
    while (
        isinstance(exc, TransformImportError)
        and frames[-1:]
        and frames[-1].filename == __file__
    ):
        frames.pop()
    report.stack = traceback.StackSummary.from_list(frames)
    print("".join(report.format()), end="", file=sys.stderr)
