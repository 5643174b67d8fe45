"""app/ is Qt-free: no module under app/ imports PySide6, pyqtgraph or widgets
(app/cli.py, the composition root, imports widgets lazily inside a function)."""
import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
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
        # cli.py may import widgets lazily (inside a function), never at module level
        for name, line in _imports(tree, top_level_only=f.name == "cli.py" and f.parent == APP):
            if name in FORBIDDEN:
                bad.append(f"{f.relative_to(APP.parent)}:{line} imports {name}")
        if f.name == "cli.py" and f.parent == APP:
            src = f.read_text()
            assert "import_module(\"widgets" in src or "widgets" not in src
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
