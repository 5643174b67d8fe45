"""The layers of app/, checked over the AST (the import-linter contracts in pyproject.toml
are checked by ``make test`` too): app/ is Qt-free (app/cli/__init__.py, the composition
root, opens the window through importlib), no package-level import cycle, no private
name imported across modules, NVML behind one module, function-local imports say why."""
import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"
FORBIDDEN = ("PySide6", "pyqtgraph", "widgets", "PyQt5", "PyQt6", "shiboken6")


def _imports(tree: ast.AST, top_level_only: bool):
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0], node.lineno


def test_app_does_not_import_qt_or_widgets():
    bad = []
    files = sorted(APP.rglob("*.py"))
    assert len(files) > 5
    for f in files:
        tree = ast.parse(f.read_text(), str(f))
        for name, line in _imports(tree, top_level_only=False):
            if name in FORBIDDEN:
                bad.append(f"{f.relative_to(APP.parent)}:{line} imports {name}")
        if f == APP / "cli" / "__init__.py":
            assert "import_module(\"widgets.main\")" in f.read_text()
    assert not bad, "\n".join(bad)


def test_importing_app_modules_does_not_load_qt():
    import subprocess
    import sys

    code = (
        "import sys, pkgutil, importlib, app\n"
        "for m in pkgutil.walk_packages(app.__path__, 'app.'):\n"
        "    if m.name.startswith('app.sim.server') or m.name.endswith('__main__'): continue\n"
        "    importlib.import_module(m.name)\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in ('PySide6', 'pyqtgraph', 'widgets')]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


#: the one module under app/ that imports pynvml (NVML's entry point)
NVML_ENTRY = APP / "telemetry" / "nvml.py"


def test_only_the_nvml_entry_module_imports_pynvml():
    """NVML is reached through app/telemetry/nvml.py only: no other module under app/
    imports ``pynvml`` (at module level or inside a function)."""
    skip: set = set()
    bad = []
    for f in sorted(APP.rglob("*.py")):
        if f == NVML_ENTRY or f in skip:
            continue
        tree = ast.parse(f.read_text(), str(f))
        for name, line in _imports(tree, top_level_only=False):
            if name == "pynvml":
                bad.append(f"{f.relative_to(APP.parent)}:{line} imports pynvml (use app.telemetry.nvml)")
    assert NVML_ENTRY.is_file()
    assert not bad, "\n".join(bad)


def _node(module: str) -> str:
    """The package-level node of a module: ``app.planner.plan`` → ``app.planner``; a
    top-level module (``app.config``) is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _module_name(f: Path) -> str:
    rel = f.relative_to(APP.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _app_imports(f: Path):
    """(imported module, line) of every ``app.*`` import in ``f``, function-local ones too;
    ``from app.x import y`` counts as an import of ``app.x.y`` when that is a module."""
    tree = ast.parse(f.read_text(), str(f))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("app."):
                    yield a.name, node.lineno, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "app" or node.module.startswith("app.")):
            for a in node.names:
                yield node.module, node.lineno, a.name


def test_no_package_level_import_cycle():
    """Between the packages of app/ (app.run, app.planner, …, and top-level modules such as
    app.config) the imports form a directed acyclic graph."""
    edges: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for f in sorted(APP.rglob("*.py")):
        src = _node(_module_name(f))
        for mod, line, _ in _app_imports(f):
            dst = _node(mod)
            if dst != src and dst != "app":
                edges.setdefault(src, set()).add(dst)
                where.setdefault((src, dst), f"{f.relative_to(APP.parent)}:{line}")
    assert len(edges) > 8
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                cyc = visit(m)
                if cyc:
                    return cyc
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            cyc = visit(n)
            assert cyc is None, "package-level import cycle: " + " → ".join(cyc) + "\n" + "\n".join(
                f"  {a} → {b}: {where[(a, b)]}" for a, b in zip(cyc, cyc[1:]))


def test_no_private_name_is_imported_across_modules():
    """``from app.x import _name`` is refused everywhere (app/, widgets/, tests/,
    benchmarks/, scripts/): a private name stays in its module."""
    root = APP.parent
    bad = []
    for d in ("app", "widgets", "tests", "benchmarks", "scripts"):
        for f in sorted((root / d).rglob("*.py")):
            tree = ast.parse(f.read_text(), str(f))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                        node.module.split(".")[0] in ("app", "widgets", "tests"):
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            bad.append(f"{f.relative_to(root)}:{node.lineno} imports {node.module}.{a.name}")
    assert not bad, "\n".join(bad)


#: words a function-local import's comment uses to say why it is deferred
DEFER_WORDS = ("defer", "lazy", "lazily", "heavy", "only", "optional", "start-up", "startup", "cycle", "frozen",
               "subprocess", "process", "GUI", "thread")


def test_function_local_imports_say_why():
    """An import inside a function (app/, widgets/) defers a heavy or optional import and
    says so in a comment on its line or the line above; everything else is imported at
    the top of the module."""
    root = APP.parent
    bad = []
    for d in ("app", "widgets"):
        for f in sorted((root / d).rglob("*.py")):
            lines = f.read_text().splitlines()
            tree = ast.parse("\n".join(lines), str(f))
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        here = lines[node.lineno - 1]
                        end = lines[node.end_lineno - 1]
                        k = node.lineno - 2  # a comment above a block of imports covers the block
                        while k >= 0 and lines[k].strip().startswith(("from ", "import ")) and "#" not in lines[k]:
                            k -= 1
                        above = lines[k] if k >= 0 else ""
                        comment = " ".join(x.split("#", 1)[1] for x in (here, end, above) if "#" in x)
                        if not any(w.lower() in comment.lower() for w in DEFER_WORDS):
                            bad.append(f"{f.relative_to(root)}:{node.lineno}: {here.strip()}")
    assert not bad, (f"{len(bad)} function-local imports without a reason (hoist them, or say why in a "
                     "comment):\n" + "\n".join(bad))
