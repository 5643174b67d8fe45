"""Issue 33, item 4: the telemetry series are named once (app.telemetry.names) — the
producers declare them with their units, and every consumer reads a declared name.

The consumers are read as source (the dashboard is a Qt module, which this tier does not
import): wherever a consumer names a series — the name argument of a SeriesBank read, of
``_window``/``_changed``/``gpu_series``, ``RunStore.samples(name=…)``, a report row, a
comparison with a sample's name — it must be a constant of app.telemetry.names that a
producer declares; a string of its own fails, as does a constant no producer declares
(every HTML report once lacked its memory and KV rows that way: ``mem_used_gib``,
``kv_cache_usage_pct``)."""
from __future__ import annotations

import ast

from app.telemetry import names
from tests.conftest import ROOT

#: every module that reads telemetry series by name
CONSUMERS = ("widgets/dashboard.py", "app/report/__init__.py", "app/run/verdict.py", "app/run/safety.py",
             "app/comparison.py", "app/run/controller.py", "app/run/outcome.py", "app/run/ramp_state.py",
             "app/run/handles.py", "app/telemetry/derived.py")

#: reader call → the index of its series-name argument (methods on a receiver named ``…bank``)
BANK_METHODS = {"get": 1, "last": 1}
FUNCTIONS = {"_window": 2, "_changed": 2, "gpu_series": 1, "TelemetryRow": 2, "mean": 0}
#: variables that hold a sample's name in the consumers' loops
NAME_VARIABLES = {"name"}


def _receiver(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def name_positions(tree: ast.AST) -> list[ast.expr]:
    """The expressions that stand for a series name in ``tree``."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f, idx = node.func, None
            if isinstance(f, ast.Attribute) and f.attr in BANK_METHODS and _receiver(f.value).endswith("bank"):
                idx = BANK_METHODS[f.attr]
            elif _receiver(f) in FUNCTIONS:
                idx = FUNCTIONS[_receiver(f)]
            if idx is not None and len(node.args) > idx:
                out.append(node.args[idx])
            if isinstance(f, ast.Attribute) and f.attr == "samples":
                out += [k.value for k in node.keywords if k.arg == "name"]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id in NAME_VARIABLES:
            out += node.comparators
    return out


def problems(source: str, where: str) -> list[str]:
    """What is wrong with how ``source`` names series: a string of its own in a name
    position, or a constant of app.telemetry.names that no producer declares."""
    tree = ast.parse(source)
    bad = []
    for expr in name_positions(tree):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            what = "declared, but name it by app.telemetry.names" if names.declared(expr.value) else "undeclared"
            bad.append(f"{where}:{expr.lineno}: {expr.value!r} ({what})")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "names":
            value = getattr(names, node.attr, None)
            if value is None:
                bad.append(f"{where}:{node.lineno}: names.{node.attr} does not exist")
            elif isinstance(value, str) and node.attr.isupper() and not names.declared(value):
                bad.append(f"{where}:{node.lineno}: names.{node.attr} = {value!r} is declared by no producer")
    return bad


def test_every_series_a_consumer_reads_is_one_a_producer_declares():
    bad, seen = [], 0
    for rel in CONSUMERS:
        source = (ROOT / rel).read_text()
        seen += len(name_positions(ast.parse(source)))
        bad += problems(source, rel)
    assert bad == [], "series named outside app.telemetry.names or declared by no producer:\n" + "\n".join(bad)
    assert seen >= 20, seen  # the scan finds the consumers' reads


def test_the_check_fails_on_a_name_no_producer_declares():
    src = ("x = bank.get('metrics', 'kv_cache_usage_pct')\n"
           "y = self.bank.last(g, names.NO_SUCH)\n"
           "z = store.samples(rid, name='mem_used_gib')\n"
           "w = _window(bank, 'metrics', 'kv_cache_usage', 0, 1)\n"
           "ok = bank.get('metrics', names.KV_CACHE_USAGE) or d.get('a', 'b')\n")
    bad = problems(src, "m.py")
    assert len(bad) == 4, bad
    assert "'kv_cache_usage_pct' (undeclared)" in bad[0] or any("kv_cache_usage_pct" in b for b in bad)
    assert any("names.NO_SUCH does not exist" in b for b in bad)
    assert any("'mem_used_gib' (undeclared)" in b for b in bad)
    assert any("'kv_cache_usage' (declared, but name it by app.telemetry.names)" in b for b in bad)


def test_every_constant_of_the_names_module_is_a_declared_series():
    consts = {k: v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
    assert len(consts) >= 15
    assert [k for k, v in consts.items() if not names.declared(v)] == []
    assert names.declared(names.POWER_W, "gpu") and not names.declared(names.POWER_W, "metrics")
    assert names.PREEMPTIONS_TOTAL in names.METRICS_SERIES
    for producer, series in names.PRODUCERS.items():
        assert series and all(isinstance(u, str) and u for u in series.values()), producer


def test_every_report_row_names_a_series_of_its_own_producer():
    from app.report import TELEMETRY

    assert [(r.what, r.producer, r.series) for r in TELEMETRY if not names.declared(r.series, r.producer)] == []
