from app.paths import data_dir, settings_path
from app.server.interpreter import resolve_python
from app.settings import Settings, load_settings, save_settings


def test_home_override(dyno_home):
    assert data_dir() == dyno_home and settings_path().parent == dyno_home


def test_round_trip_and_broken_file(dyno_home):
    s = Settings(vllm_python="/opt/vllm/bin/python", gpu_sample_hz=2)
    save_settings(s)
    assert load_settings() == s
    assert resolve_python() == "/opt/vllm/bin/python"
    settings_path().write_text("gpu_sample_hz: [oops\n")
    bad = load_settings()
    assert bad.load_error and "settings.yaml" in bad.load_error and bad.gpu_sample_hz == 4.0
    settings_path().write_text("gpu_sample_hz: -1\n")
    assert "gpu_sample_hz" in load_settings().load_error


def test_python_resolution_order(monkeypatch, dyno_home):
    monkeypatch.setenv("VLLM_DYNO_VLLM_PYTHON", "/env/python")
    assert resolve_python("/explicit/python") == "/explicit/python"
    assert resolve_python() == "/env/python"
    monkeypatch.delenv("VLLM_DYNO_VLLM_PYTHON")
    assert resolve_python().endswith(".venv-vllm/bin/python")


# ---------------------------------------------------------------- schema_version, partial loading
import logging  # noqa: E402

import yaml  # noqa: E402

from app.settings import SCHEMA_VERSION, load_settings_report  # noqa: E402


def test_one_bad_key_keeps_the_good_ones_and_names_it(dyno_home, caplog):
    settings_path().write_text(f"schema_version: {SCHEMA_VERSION}\nvllm_python: /opt/py\ngpu_sample_hz: -1\n"
                               "metrics_scrape_hz: 5\nsafety: {enabled: false, thermal_margin_c: hot}\n")
    with caplog.at_level(logging.WARNING, logger="app.settings"):
        r = load_settings_report()
    s = r.settings
    assert s.vllm_python == "/opt/py" and s.metrics_scrape_hz == 5 and s.safety.enabled is False
    assert s.gpu_sample_hz == 4.0 and s.safety.thermal_margin_c == 3.0  # the defaults
    assert len(r.dropped) == 2
    gpu, margin = sorted(r.dropped)
    assert "gpu_sample_hz = -1" in gpu and "greater than 0" in gpu and "default 4.0" in gpu and "Fix" in gpu
    assert "safety.thermal_margin_c = 'hot'" in margin
    assert "gpu_sample_hz" in caplog.text and "safety.thermal_margin_c" in caplog.text
    assert "gpu_sample_hz" in s.load_error  # load_settings() callers see it too
    assert load_settings().vllm_python == "/opt/py"
    assert "gpu_sample_hz: -1" in settings_path().read_text()  # the user's file is not rewritten


def test_unknown_and_wrongly_typed_keys_are_dropped(dyno_home):
    settings_path().write_text(f"schema_version: {SCHEMA_VERSION}\ncolour: red\nvllm_python: 5\n"
                               "gpu_sample_hz: 8\nsafety: {bogus: 1, max_failure_rate: 0.5}\n")
    r = load_settings_report()
    assert r.settings.gpu_sample_hz == 8 and r.settings.safety.max_failure_rate == 0.5
    assert r.settings.vllm_python is None
    text = "\n".join(r.dropped)
    assert "unknown key 'colour'" in text and "'red'" in text and "unknown key 'safety.bogus'" in text
    assert "vllm_python = 5" in text and len(r.dropped) == 3


def test_file_without_schema_version_is_upgraded(dyno_home):
    (dyno_home / "gui.ini").write_text("[General]\ngeometry=@ByteArray(\\x1\\xd9)\nlast_profile=my-rig\n")
    settings_path().write_text("vllm_python: /opt/py\ngpu_sample_hz: 2\n")  # a v0 file
    r = load_settings_report()
    assert r.file_version == 0 and r.upgraded and r.rewritten and r.messages == []
    assert r.settings.vllm_python == "/opt/py" and r.settings.gpu_sample_hz == 2
    assert r.settings.last_profile == "my-rig"  # the real setting moved out of gui.ini
    on_disk = yaml.safe_load(settings_path().read_text())
    assert on_disk["schema_version"] == SCHEMA_VERSION == 1
    assert on_disk["vllm_python"] == "/opt/py" and on_disk["last_profile"] == "my-rig"
    again = load_settings_report()
    assert again.file_version == 1 and not again.upgraded and again.settings == r.settings


def test_gui_ini_last_profile_does_not_override_a_current_file(dyno_home):
    (dyno_home / "gui.ini").write_text("[General]\nlast_profile=old-one\n")
    assert load_settings().last_profile == "old-one"  # no settings.yaml yet: taken over
    save_settings(Settings(last_profile=None))
    assert load_settings().last_profile is None


def test_newer_schema_loads_what_it_knows_and_says_so(dyno_home):
    settings_path().write_text("schema_version: 99\ngpu_sample_hz: 3\nfuture_knob: 7\n"
                               "safety: {enabled: false, future_limit: 2}\n")
    r = load_settings_report()
    assert r.file_version == 99 and not r.upgraded and r.dropped == []
    assert r.settings.gpu_sample_hz == 3 and r.settings.safety.enabled is False
    (note,) = r.notes
    assert "newer vLLM Dyno" in note and "99" in note and "future_knob" in note and "Upgrade" in note
    assert r.settings.load_error == note
    save_settings(r.settings.model_copy(update={"gpu_sample_hz": 6.0}))
    on_disk = yaml.safe_load(settings_path().read_text())
    assert on_disk["schema_version"] == 99 and on_disk["future_knob"] == 7
    assert on_disk["safety"]["future_limit"] == 2 and on_disk["gpu_sample_hz"] == 6.0


def test_save_writes_schema_version_atomically(dyno_home, monkeypatch):
    save_settings(Settings(gpu_sample_hz=3))
    assert yaml.safe_load(settings_path().read_text())["schema_version"] == SCHEMA_VERSION
    import app.fileio

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(app.fileio.os, "replace", boom)
    try:
        save_settings(Settings(gpu_sample_hz=9))
    except OSError:
        pass
    assert load_settings().gpu_sample_hz == 3  # the old file is intact
    assert [p.name for p in dyno_home.iterdir() if p.name.endswith(".tmp")] == []


def test_settings_dialog_lists_dropped_keys_and_saves_clean(qtbot, dyno_home):
    from widgets.settings_dialog import SettingsDialog

    settings_path().write_text("schema_version: 1\ngpu_sample_hz: -1\nlast_profile: my-rig\n")
    s = load_settings()
    dlg = SettingsDialog(s)
    qtbot.addWidget(dlg)
    assert not dlg.load_problems.isHidden() and "gpu_sample_hz = -1" in dlg.load_problems.text()
    out = dlg.result_settings()
    assert out.load_error is None and out.last_profile == "my-rig" and out.gpu_sample_hz == 4.0
    save_settings(out)
    assert load_settings_report().messages == []
    clean = SettingsDialog(Settings())
    qtbot.addWidget(clean)
    assert clean.load_problems.isHidden()
