"""One builder makes a :class:`app.run.target.LaunchTarget` (issue 33, item 6).

Every front end — the window, ``vllm-dyno run``/``serve``/``ramp``, the tuner and the
benchmarks — makes its launch target through :func:`app.run.target.launch_target`, so a
field (the profile's sim rig, hosts and Ray address, an attached server's config) is
derived in one place. **The rule**, checked on every ``.py`` file under ``app/``,
``widgets/`` and ``benchmarks/``: a call of ``LaunchTarget(...)`` (by that name, or as
``x.LaunchTarget(...)``) outside ``app/run/target.py`` fails, naming ``file:line``.
Tests build targets by hand freely (they pin the dataclass itself).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from app.config import ServerConfig
from app.engines import Engine
from app.profiles.model import Profile
from app.run.target import LaunchTarget, launch_target
from tests.conftest import ROOT

FOLDERS = ("app", "widgets", "benchmarks")
BUILDER_MODULE = "app/run/target.py"


def _constructions(path: Path) -> list[int]:
    """Lines of ``LaunchTarget(...)`` calls in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else None)
            if name == "LaunchTarget":
                lines.append(node.lineno)
    return lines


def test_launch_target_is_built_only_by_its_builder() -> None:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == BUILDER_MODULE or "LaunchTarget" not in path.read_text(encoding="utf-8"):
                continue  # parsed only where the name occurs: the tree is read in well under a second
            found += [f"{rel}:{n}" for n in _constructions(path)]
    assert not found, ("LaunchTarget(...) built by hand (use app.run.target.launch_target, the one builder): "
                       + ", ".join(found))


def test_the_check_sees_a_construction(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import app.run.target as t\nx = LaunchTarget('sim', c)\ny = t.LaunchTarget('sim', c)\n")
    assert _constructions(src) == [2, 3]


def test_builder_attach_without_config() -> None:
    t = launch_target(Engine.ATTACH, attach_url="http://127.0.0.1:8000", attach_model="q7")
    assert t == LaunchTarget(engine=Engine.ATTACH, config=ServerConfig(model="q7"), attach_url="http://127.0.0.1:8000",
                             attach_model="q7")
    assert launch_target("attach", attach_url="http://h:1").config.model == "attached"


def test_builder_needs_an_engine_and_a_config_to_launch() -> None:
    with pytest.raises(ValueError):
        launch_target()
    with pytest.raises(ValueError):
        launch_target(Engine.VLLM)


def test_builder_copies_the_callers_lists() -> None:
    args = ["--sim-gpu", "A100"]
    t = launch_target("sim", ServerConfig(model="m"), sim_args=args)
    t.sim_args.append("x")
    assert args == ["--sim-gpu", "A100"] and t.engine is Engine.SIM


def test_builder_from_a_profile() -> None:
    prof = Profile.model_validate({"name": "p", "engine": "sim", "server": {"model": "Qwen/Qwen2.5-7B-Instruct"},
                                   "sim": {"gpu": "RTX 4090", "count": 1}})
    t = launch_target(profile=prof, telemetry=False, grace=3.0)
    assert t.engine is Engine.SIM and t.config == prof.server_config()
    assert t.sim_args == prof.sim.argv() and t.telemetry is False and t.grace == 3.0
    assert LaunchTarget.from_profile(prof, telemetry=False, grace=3.0) == t
