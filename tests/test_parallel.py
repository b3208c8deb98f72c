"""`-j N`: files converted in worker processes say and write what a serial run does.

Each case builds the same tree twice, runs the CLI on one copy with `-j 1` (in process)
and on the other with `-j 2` (a pool), and compares the exit code, stdout, stderr and
every file's bytes.
"""

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def differentiator(name, factor):
    return (
        "import torch\n\n\n"
        f"def {name}(x):\n"
        "    t = x * x\n"
        "    def backward(grad):\n"
        f"        return {factor} * grad * x + 0 * t\n"
        "    return t, backward\n"
    )


BAD = "def bad(x):\n    def backward(grad):\n        return grad\n    return x, backward, 1\n"

FILES = {
    "pkg/__init__.py": "",
    "pkg/a.py": differentiator("a", 2.0),
    "pkg/b.py": differentiator("b", 3.0),
    "pkg/plain.py": "X = 1\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/c.py": differentiator("c", 4.0),
    "pkg/sub/d.py": differentiator("d", 5.0),
}


def s2sgrad(*args, cwd, prelude=""):
    """Run the CLI as a user would; `prelude` runs first (to break something)."""
    code = f"import sys\n{prelude}\nfrom s2sgrad.cli import main\nsys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
        timeout=300,
    )


def tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def snapshot(root):
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def spy(marker):
    """A prelude that touches `marker` when the CLI starts a pool of workers."""
    return (
        "import concurrent.futures\n"
        "class Spy(concurrent.futures.ProcessPoolExecutor):\n"
        "    def __init__(self, *args, **kwargs):\n"
        f"        open({str(marker)!r}, 'w').close()\n"
        "        super().__init__(*args, **kwargs)\n"
        "concurrent.futures.ProcessPoolExecutor = Spy  # the CLI imports it late\n"
    )


def twice(tmp_path, files, *args, pooled=True):
    """Run `args` with `-j 1` and `-j 2` on two copies of `files`; return both.

    Checks that only the second started a pool (`pooled=False`: neither did).
    """
    runs = []
    for workers in ("1", "2"):
        root = tree(tmp_path / f"j{workers}", files)
        marker = tmp_path / f"pool-j{workers}"
        run = s2sgrad(*args, "-j", workers, cwd=root, prelude=spy(marker))
        assert marker.exists() == (pooled and workers == "2"), run.stderr
        runs.append((run.returncode, run.stdout, run.stderr, snapshot(root)))
    return runs


def test_convert_on_two_workers_writes_what_one_writes(tmp_path):
    serial, parallel = twice(tmp_path, FILES, "convert", "-v", "pkg")
    # `-v` says how long it took, which no two runs share.
    took = re.compile(r" in \d+\.\d\d s$", re.MULTILINE)
    serial, parallel = (
        (code, out, took.sub(" in T s", err), files)
        for code, out, err, files in (serial, parallel)
    )
    assert parallel == serial
    code, _, stderr, files = serial
    assert re.search(r"s2sgrad: 4 file\(s\), \d+ generated lines in T s\n$", stderr)
    assert code == 0, stderr
    assert stderr.splitlines()[:4] == [
        "wrote pkg/a_grad.py",
        "wrote pkg/b_grad.py",
        "wrote pkg/sub/c_grad.py",
        "wrote pkg/sub/d_grad.py",
    ]
    assert "pkg/plain_grad.py" not in files


def test_one_bad_file_on_two_workers_fails_as_on_one_and_writes_nothing(tmp_path):
    files = {**FILES, "pkg/sub/bad.py": BAD, "pkg/sub/bad2.py": BAD}
    serial, parallel = twice(tmp_path, files, "convert", "pkg")
    assert parallel == serial
    code, stdout, stderr, written = serial
    assert code == 2 and stdout == ""
    assert stderr.index("pkg/sub/bad.py:4:") < stderr.index("pkg/sub/bad2.py:4:")
    assert "2 file(s) failed; nothing written" in stderr
    assert written == snapshot(tree(tmp_path / "fresh", files))


@pytest.mark.parametrize("flags", [["--check"], ["--diff"], ["--check", "--diff"]])
def test_check_and_diff_on_two_workers_report_what_one_reports(tmp_path, flags):
    """One output up to date (answered from its header), one stale, two missing."""
    made = tree(tmp_path / "made", FILES)
    assert s2sgrad("convert", "-j", "1", "pkg", cwd=made).returncode == 0
    files = {**FILES, "pkg/a_grad.py": (made / "pkg/a_grad.py").read_text()}
    files["pkg/b_grad.py"] = (made / "pkg/b_grad.py").read_text().replace("3.0", "3.5")
    serial, parallel = twice(tmp_path, files, "convert", *flags, "pkg")
    assert parallel == serial
    code, stdout, stderr, _ = serial
    assert code == 1
    assert stderr.splitlines()[:3] == [
        "would update pkg/b_grad.py (stale)",
        "would create pkg/sub/c_grad.py (missing)",
        "would create pkg/sub/d_grad.py (missing)",
    ]
    assert ("--- pkg/b_grad.py" in stdout) == ("--diff" in flags)


@pytest.mark.parametrize("flag", ["--check", "--diff"])
def test_check_with_a_bad_file_on_two_workers_exits_2_as_on_one(tmp_path, flag):
    serial, parallel = twice(
        tmp_path, {**FILES, "pkg/bad.py": BAD}, "convert", flag, "pkg"
    )
    assert parallel == serial
    assert serial[0] == 2 and "pkg/bad.py:4:" in serial[2]


def test_review_on_two_workers_prints_what_one_prints(tmp_path):
    serial, parallel = twice(tmp_path, FILES, "review", "pkg")
    assert parallel == serial
    code, stdout, stderr, _ = serial
    assert code == 0, stderr
    shown = [stdout.index(f"pkg/{name}.py") for name in ("a", "b", "sub/c", "sub/d")]
    assert shown == sorted(shown)


def test_where_a_pool_cannot_start_the_files_convert_in_process(tmp_path):
    """No /dev/shm (AWS Lambda) makes the pool's locks raise OSError: run serially."""
    prelude = (
        "import concurrent.futures\n"
        "def no_pool(*args, **kwargs):\n"
        "    raise OSError(38, 'Function not implemented')\n"
        "concurrent.futures.ProcessPoolExecutor = no_pool\n"
    )
    files = {**FILES, "pkg/bad.py": BAD}
    serial, _ = twice(tmp_path, files, "convert", "pkg")
    fallback = tree(tmp_path / "fallback", files)
    run = s2sgrad("convert", "-j", "2", "pkg", cwd=fallback, prelude=prelude)
    assert (run.returncode, run.stdout, run.stderr, snapshot(fallback)) == serial


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="the broken engine reaches the workers only through fork",
)
def test_an_internal_error_in_a_worker_exits_123_naming_the_first_file(tmp_path):
    prelude = (
        "import multiprocessing\n"
        "multiprocessing.set_start_method('fork')\n"
        "import s2sgrad.pipeline as pipeline\n"
        "real = pipeline.convert\n"
        "def convert(text, origin, options):\n"
        "    if origin.display_path.endswith(('b.py', 'd.py')):\n"
        "        raise KeyError('broken on ' + origin.display_path)\n"
        "    return real(text, origin, options)\n"
        "pipeline.convert = convert\n"
    )
    root = tree(tmp_path, FILES)
    before = snapshot(root)
    run = s2sgrad("convert", "-j", "2", "pkg", cwd=root, prelude=prelude)
    assert run.returncode == 123, run.stderr
    assert "internal error: KeyError: 'broken on pkg/b.py'" in run.stderr
    log = Path(run.stderr.split("traceback is in ")[1].split(";")[0])
    assert "broken on pkg/b.py" in log.read_text()
    log.unlink()
    assert snapshot(root) == before


def test_workers_must_be_a_positive_number(tmp_path):
    run = s2sgrad("convert", "-j", "0", "pkg", cwd=tree(tmp_path, FILES))
    assert run.returncode == 2
    assert "-j/--workers: must be a positive integer, got '0'" in run.stderr


def test_an_up_to_date_tree_is_checked_without_starting_a_pool(tmp_path):
    """`--check` answers fresh outputs from their headers, here, before any worker.

    (A module without differentiators still goes to the engine, which must parse it
    to say so: the tree holds none.)
    """
    sources = {rel: text for rel, text in FILES.items() if "def " in text}
    made = tree(tmp_path / "made", sources)
    assert s2sgrad("convert", "-j", "1", "pkg", cwd=made).returncode == 0
    files = {rel: data.decode() for rel, data in snapshot(made).items()}
    serial, parallel = twice(tmp_path, files, "convert", "--check", "pkg", pooled=False)
    assert parallel == serial
    assert serial[0] == 0 and "4 output(s) up to date" in serial[2]


def test_the_cli_imports_the_process_pool_only_to_start_one():
    """`convert --check` and one-file runs never start a pool; importing it took a
    sixth of the CLI's start-up, most of a `--check` run."""
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, s2sgrad.cli; print('concurrent.futures.process' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "False"


def test_one_large_module_is_converted_in_processes_to_the_same_bytes(tmp_path):
    """A single file under `-j 2` has its differentiators converted in two forked
    processes: the module is byte for byte the one `-j 1` writes."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.convert_speed import synthetic_module
    finally:
        sys.path.remove(str(ROOT))
    (tmp_path / "big.py").write_text(synthetic_module(20))
    outputs = []
    for workers in ("1", "2"):
        run = subprocess.run(
            [sys.executable, "-m", "s2sgrad", "convert", "-j", workers, "--stdout"]
            + ["big.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0].count("\nclass ") == 20


def _benchmark_modules():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import convert_speed
    finally:
        sys.path.remove(str(ROOT))
    return convert_speed


def _converted(source, processes, forks, **options):
    """`pipeline.convert` of `source` with `PROCESSES` at `processes`; `forks`
    gathers whether each call of `fork_map` forked ("called" where it raised)."""
    from s2sgrad import pipeline
    from s2sgrad.header import Origin
    from s2sgrad.options import Options

    real = pipeline.fork_map

    def recording(*args):
        forks.append("called")
        found = real(*args)
        forks[-1] = found is not None
        return found

    token = pipeline.PROCESSES.set(processes)
    pipeline.fork_map = recording
    try:
        return pipeline.convert(source, Origin("ops.py", "ops"), Options(**options))
    finally:
        pipeline.fork_map = real
        pipeline.PROCESSES.reset(token)


@pytest.mark.skipif(sys.platform != "linux", reason="forked processes on Linux only")
@pytest.mark.parametrize(
    "options", [{}, {"compile": True, "standalone": True}, {"policy": "first-order"}]
)
def test_a_module_converted_in_forked_processes_is_the_one_converted_here(options):
    """Closure-style rules as people write them (tests/corpus/ as one module): the
    differentiators lifted, differentiated and formatted in two forked processes give
    the module byte for byte."""
    source = _benchmark_modules().closure_module()
    forks = []
    here = _converted(source, 1, forks, **options)
    there = _converted(source, 2, forks, **options)
    assert forks == [True]
    assert there == here


def test_parts_cut_at_every_differentiator_assemble_the_module():
    """The code of each run of differentiators is the same wherever the runs are
    cut: one part per differentiator assembles the module `generate` writes."""
    from s2sgrad import codegen, pipeline
    from s2sgrad.header import Origin
    from s2sgrad.options import Options

    source = _benchmark_modules().synthetic_module(12)
    origin, options = Origin("ops.py", "ops"), Options()
    parsed, records = pipeline.analyse(source, origin, options)
    sources = [item.source for item in records]
    layout = codegen.plan(parsed, sources, options, origin.display_path)
    parts = [codegen.part(layout, [item]) for item in records]
    whole = codegen.generate(parsed, records, options, origin)
    assert codegen.assemble(parsed, sources, parts, options, origin) == whole
    assert whole == pipeline.convert(source, origin, options)


@pytest.mark.skipif(sys.platform != "linux", reason="forked processes on Linux only")
def test_a_failure_in_a_forked_run_is_the_one_the_serial_loop_reports():
    """Two differentiators that cannot be differentiated (a replay would redraw
    random numbers), in different runs: both ways report the first, located."""
    from s2sgrad.diagnostics import TransformError

    bad = (ROOT / "tests" / "bad_inputs" / "recompute_gumbel_softmax.py").read_text()
    rule = bad[bad.index("def gumbel_scaled") :]
    good = _benchmark_modules().synthetic_module(12)
    rules = re.findall(r"^def .*?(?=^def |\Z)", good, re.S | re.M)
    late = rule.replace("gumbel_scaled", "late")
    source = "import torch\nimport torch.nn.functional as F\n\n\n" + "\n\n".join(
        [*rules[:3], rule, *rules[3:], late]
    )
    found = []
    for processes in (1, 2):
        forks = []
        with pytest.raises(TransformError) as caught:
            _converted(source, processes, forks)
        assert forks == (["called"] if processes == 2 else [])
        found.append([(d.code, d.line, d.column, d.message) for d in caught.value.diagnostics])
    assert found[0] == found[1]
    assert [code for code, *_ in found[0]] == ["S2S121"]
    assert found[0][0][1] == source.splitlines().index(rule.splitlines()[1]) + 1


def test_a_conversion_collects_garbage_rarely_and_restores_the_thresholds():
    """The import hook converts inside the user's process: the collector's thresholds
    are raised while a module converts (and in the processes it forks), and given
    back as they were, even when the conversion fails."""
    import gc

    from s2sgrad import pipeline
    from s2sgrad.diagnostics import TransformError
    from s2sgrad.header import Origin
    from s2sgrad.options import Options

    seen = []
    front = pipeline._front

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return front(*args, **kwargs)

    before = gc.get_threshold()
    pipeline._front = spy
    try:
        pipeline.convert(differentiator("a", 2.0), Origin("a.py", "a"), Options())
        with pytest.raises(TransformError):
            pipeline.convert(BAD, Origin("bad.py", "bad"), Options())
    finally:
        pipeline._front = front
    assert gc.get_threshold() == before
    assert len(seen) == 2
    assert all(young >= pipeline._YOUNG_THRESHOLD for young, *_ in seen)
    assert all(older == list(before[1:]) for _, *older in seen)


def _run_length(run, state):
    return (run[1] - run[0]) * state


@pytest.mark.skipif(sys.platform != "linux", reason="forked processes on Linux only")
def test_forked_runs_leave_nothing_frozen_here():
    """`fork_map` freezes this process's objects for the fork (the children's
    collector then leaves their pages alone) and thaws them after, also when a run
    fails; what was frozen before (the CLI freezes the engine) stays frozen."""
    import gc

    from s2sgrad.processes import fork_map

    gc.unfreeze()  # whatever an earlier test in this process froze
    assert fork_map(_run_length, [(0, 2), (2, 5)], 10, 2) == [20, 30]
    assert gc.get_freeze_count() == 0
    with pytest.raises(TypeError):
        fork_map(_run_length, [(0, 2)], None, 2)
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert fork_map(_run_length, [(0, 2)], 10, 2) == [20]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
