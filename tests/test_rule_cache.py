"""The built derivative rules, kept beside rules.py's bytecode between processes.

Every process that converts used to parse each rule it needed through the frontend
(a third of converting a module of many closures). `builtin_registry` now keeps the
built rules in rules.py's `__pycache__`; these tests point `sys.pycache_prefix` at a
temporary folder, so they never touch the checkout's own cache.
"""

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from s2sgrad.autodiff import registry
from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.pipeline import convert

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ["temporary", "normalization", "options", "multi_output"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh registry whose cache entries go under `tmp_path`."""
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    registry.builtin_registry.cache_clear()
    yield tmp_path
    registry.builtin_registry.cache_clear()


def _entries(folder):
    return sorted(folder.rglob("rules.*.s2sgrad-rules"))


def _converted():
    """Each sample module as the pipeline converts it now."""
    texts = {}
    for name in SAMPLES:
        path = f"samples/{name}.py"
        source = (ROOT / path).read_text()
        texts[name] = convert(source, Origin(path, f"samples.{name}"), Options())
    return texts


def _goldens():
    return {n: (ROOT / f"samples/{n}_grad.py").read_text() for n in SAMPLES}


def test_a_cached_registry_converts_byte_for_byte_as_parsed_rules_do(
    cache, monkeypatch
):
    built = registry.builtin_registry()
    (entry,) = _entries(cache)
    assert len(built.rules.built) == len(built.rules.functions)  # every rule, once
    registry.builtin_registry.cache_clear()

    def no_parsing(*args, **kwargs):
        raise AssertionError("a rule was parsed although the cache holds it")

    monkeypatch.setattr(registry, "parse", no_parsing)
    loaded = registry.builtin_registry()
    assert loaded is not built and not loaded.rules.functions  # read, not parsed
    assert set(loaded.rules) == set(built.rules)
    assert _converted() == _goldens()
    assert _entries(cache) == [entry]


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # a write cut short
        lambda data: data.replace(b"s2sgrad-rules 1", b"s2sgrad-rules 0", 1),
        lambda data: data[:16] + b"0" * 64 + data[80:],  # another key
        lambda data: data.split(b"\n", 2)[0] + b"\n" + data.split(b"\n", 2)[1]
        + b"\n" + pickle.dumps(["not", "rules"]),
    ],
    ids=["truncated", "other-layout", "stale-key", "foreign-pickle"],
)
def test_a_damaged_entry_is_a_miss_and_is_written_again(cache, damage):
    registry.builtin_registry()
    (entry,) = _entries(cache)
    whole = entry.read_bytes()
    entry.write_bytes(damage(whole))
    registry.builtin_registry.cache_clear()
    rebuilt = registry.builtin_registry()
    assert rebuilt.rules.functions  # parsed again
    assert entry.read_bytes() == whole
    assert _converted() == _goldens()


def test_no_entry_is_written_where_bytecode_is_not(cache, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    rules = registry.builtin_registry().rules
    assert rules.built == {}  # lazy: only the rules a conversion uses get parsed
    assert _converted() == _goldens()
    assert _entries(cache) == []


def test_a_cache_folder_that_cannot_be_made_leaves_the_rules_lazy(
    cache, monkeypatch
):
    blocker = cache / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(sys, "pycache_prefix", str(blocker))
    rules = registry.builtin_registry().rules
    assert rules.built == {}
    assert _converted() == _goldens()
    assert _entries(cache) == []


def test_the_key_covers_the_rules_and_every_source_file_of_s2sgrad(
    tmp_path, monkeypatch
):
    """Rules are built by s2sgrad's frontend: a change anywhere in the package (a
    development checkout) must not serve rules that the code now would build
    otherwise."""
    copy = tmp_path / "s2sgrad"
    shutil.copytree(ROOT / "s2sgrad", copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(registry, "RULES_PATH", copy / "autodiff" / "rules.py")
    source = registry.RULES_PATH.read_text()
    first = registry._RuleCache.of(source)
    assert first is not None
    assert registry._RuleCache.of(source) == first
    assert registry._RuleCache.of(source + "\n# edited\n").key != first.key
    scopes = copy / "frontend" / "scopes.py"
    scopes.write_text(scopes.read_text() + "\n# edited\n")
    assert registry._RuleCache.of(source).key != first.key


def test_processes_share_the_entry(tmp_path):
    """The first process writes the entry, the next reads it; both convert alike."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    script = (
        "import sys\n"
        "from s2sgrad.autodiff import registry\n"
        "rules = registry.builtin_registry().rules\n"
        "print('parsed' if rules.functions else 'read')\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()
        for _ in range(2)
    ]
    assert runs == [["parsed"], ["read"]]
    assert len(_entries(tmp_path / "pycache")) == 1
