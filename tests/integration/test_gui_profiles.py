"""The profile manager in the window: list (built-ins read-only), new, save, save as,
rename, delete, import (a pasted ``vllm serve`` line, a ``--config`` YAML), export
(command line, ``--config`` YAML) — on real files in the test's VLLM_DYNO_HOME.
pytest-qt, offscreen."""
from __future__ import annotations

import os

import pytest
import yaml
from PySide6.QtWidgets import QInputDialog, QMessageBox

from app.profiles import ProfileLibrary, ResultsSummary, import_text, parse_profile
from app.profiles.edit import DEMO_NAME, profile_from_settings
from tests.plugins.qt import pump

SHOTS = os.environ.get("DYNO_SHOTS")

CMD = ("NCCL_P2P_DISABLE=1 CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen2.5-7B-Instruct "
       "--tensor-parallel-size 2 --max-num-seqs 64 --enforce-eager")
CONFIG_YAML = """\
model: Qwen/Qwen2.5-32B-Instruct-AWQ
quantization: awq_marlin
tensor-parallel-size: 4
max-model-len: 16384
gpu-memory-utilization: 0.9
"""


@pytest.fixture
def manager(main_window, qtbot):
    w = main_window
    w.tabs.setCurrentWidget(w.profile_manager)
    pump(qtbot, lambda: w.profile_manager._loaded, 5, "the manager scans when shown")
    return w, w.profile_manager


def _combo_names(w) -> list[str]:
    return [w.config.profile.itemText(i) for i in range(w.config.profile.count())]


def test_lists_builtins_read_only(manager):
    w, pm = manager
    names = pm.names()
    builtins = [e.name for e in ProfileLibrary().builtin_entries()]
    assert len(builtins) >= 6 and set(builtins) <= set(names)
    pm.select(DEMO_NAME)
    assert pm.selected().read_only
    assert not pm.buttons["delete"].isEnabled() and not pm.buttons["rename"].isEnabled()
    assert pm.buttons["save"].isEnabled() and pm.buttons["save_as"].isEnabled()
    assert "built-in" in pm.title.text()
    assert pm.preview.toPlainText().startswith("schema_version: 1")
    with pytest.raises(PermissionError):
        pm.delete(DEMO_NAME)
    with pytest.raises(PermissionError):
        pm.rename(DEMO_NAME, "x")
    pm.fmt.setCurrentIndex(0)  # command line
    assert "vllm serve hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4" in pm.preview.toPlainText()
    if SHOTS:
        from PySide6.QtWidgets import QApplication

        QApplication.processEvents()  # pending layouts first
        w.grab().save(os.path.join(SHOTS, "profiles.png"))


def test_new_save_save_as_rename_delete(manager, dyno_home):
    w, pm = manager
    pm.new_profile("rig A")
    assert (dyno_home / "profiles" / "rig-a.yaml").is_file()
    assert pm.selected_name() == "rig A" and "rig A" in _combo_names(w)
    with pytest.raises(FileExistsError):
        pm.new_profile("rig A")
    w.config.max_num_seqs.setValue(32)
    w.ramp.find.setChecked(False)  # fixed levels (the demo's SLO made it a capacity search)
    w.ramp.levels.setText("1,2,4")
    pm.save("rig A")
    p = ProfileLibrary().get("rig A")
    assert p.server["max-num-seqs"] == 32 and p.ramp.levels == [1, 2, 4] and p.engine == "sim"
    pm.save_as("rig B")
    with pytest.raises(FileExistsError):
        pm.save_as("rig B")
    pm.rename("rig B", "rig C")
    lib = ProfileLibrary()
    assert lib.get("rig C").server["max-num-seqs"] == 32
    assert "rig B" not in lib.scan().names() and "rig C" in _combo_names(w) and "rig B" not in _combo_names(w)
    pm.delete("rig C")
    assert "rig C" not in ProfileLibrary().scan().names() and "rig C" not in pm.names()
    # saving into a built-in makes a user copy of the same name
    pm.select(DEMO_NAME)
    path = pm.save()
    assert path.parent == dyno_home / "profiles"
    e = ProfileLibrary().entry(DEMO_NAME)
    assert e.source == "user" and e.shadows_builtin


def test_buttons_ask_and_act(manager, monkeypatch):
    w, pm = manager
    answers = iter([("rig D", True), ("rig E", True)])
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: next(answers))
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    warnings: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text, *a: warnings.append(text))
    pm.buttons["new"].click()
    assert pm.selected_name() == "rig D"
    pm.buttons["rename"].click()
    assert pm.selected_name() == "rig E" and "rig D" not in pm.names()
    pm.buttons["delete"].click()
    assert "rig E" not in pm.names() and not warnings
    pm.select(DEMO_NAME)
    pm.buttons["use"].click()
    assert w.profile_name == DEMO_NAME


def test_import_command_line_and_config_yaml_then_export(manager, tmp_path):
    w, pm = manager
    p = pm.import_profile(CMD, "from cmd")
    assert p.server["tensor-parallel-size"] == 2 and p.server["enforce-eager"] is True
    assert p.env == {"NCCL_P2P_DISABLE": "1"} and p.gpus == [0, 1]
    assert pm.selected_name() == "from cmd" and "from cmd" in _combo_names(w)
    cmd = pm.export("from cmd", "cmd", tmp_path / "serve.sh")
    again = import_text(cmd, "again")
    assert again.server == p.server and again.env == p.env and again.gpus == p.gpus
    q = pm.import_profile(CONFIG_YAML, "from yaml")
    out = pm.export("from yaml", "yaml", tmp_path / "cfg.yaml")
    assert yaml.safe_load(out) == yaml.safe_load(CONFIG_YAML) == q.server
    assert yaml.safe_load((tmp_path / "cfg.yaml").read_text()) == q.server
    # use it: the form shows the imported settings
    pm.select("from cmd")
    pm.buttons["use"].click()
    cfg = w.config.build_config()
    assert w.profile_name == "from cmd" and cfg.model == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.tensor_parallel_size == 2 and cfg.max_num_seqs == 64 and cfg.enforce_eager
    assert w.config.engine_key() == "vllm"
    # a broken paste is an error naming the input, nothing is saved
    with pytest.raises(Exception, match="broken YAML|no vLLM options|neither"):
        pm.import_profile("model: [unclosed", "bad")
    assert "bad" not in pm.names()


def test_results_are_kept_only_for_unchanged_settings():
    base = parse_profile("name: r\nengine: sim\nsim: {gpu: RTX 4090, count: 2}\n"
                         "server: {model: Qwen/Qwen2.5-7B-Instruct, tensor-parallel-size: 2}\n")
    base = base.updated(results=ResultsSummary.from_levels([{"level": 1, "output_tps": 10.0}], run_id=3),
                        notes="keep me")
    same = profile_from_settings("r", engine="sim", sim={"gpu": "RTX 4090", "count": 2},
                                 server={"model": "Qwen/Qwen2.5-7B-Instruct", "tensor-parallel-size": 2,
                                         "gpu-memory-utilization": 0.9}, ramp={"levels": [1, 2]}, base=base)
    assert same.results is not None and same.results.run_id == 3 and same.notes == "keep me"
    changed = profile_from_settings("r", engine="sim", sim={"gpu": "RTX 4090", "count": 2},
                                    server={"model": "Qwen/Qwen2.5-7B-Instruct", "tensor-parallel-size": 2,
                                            "max-num-seqs": 8}, base=base)
    assert changed.results is None and changed.notes == "keep me"
    other_rig = profile_from_settings("r", engine="sim", sim={"gpu": "RTX 4090", "count": 4},
                                      server=dict(base.server), base=base)
    assert other_rig.results is None
