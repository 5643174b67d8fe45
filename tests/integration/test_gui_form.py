"""GUI form, plan panel, settings, log pane and window state (pytest-qt, offscreen)."""
from __future__ import annotations

import time

import pytest
from PySide6.QtWidgets import QApplication, QPushButton

from app.config import ServerConfig
from app.profiles.model import SimRig
from tests.plugins.qt import pump


def _plan_settled(w):
    return lambda: w.plan is not None and not w.planner.busy and not w.planner._timer.isActive()


def test_opens_on_sim_demo_ready_to_launch(main_window, qtbot):
    w = main_window
    assert w.config.engine_key() == "sim"
    assert w.config.sim_count.value() == 8
    pump(qtbot, lambda: w.config.sim_gpu.currentText() == "RTX 4090", 10, "rig GPU is the RTX 4090")
    pump(qtbot, _plan_settled(w), 20, "the demo profile is planned")
    assert w.plan.verdict != "error", w.plan.findings
    assert w.act_launch.isEnabled(), w.act_launch.toolTip()
    assert not w.act_ramp.isEnabled() and not w.act_stop.isEnabled()
    assert "sim" in w.state_label.text() and "idle" in w.state_label.text()
    pump(qtbot, lambda: "GPUs:" in w.gpus_label.text() and "detecting" not in w.gpus_label.text(), 20,
         "GPU detection reports in the status bar")


def test_tp_not_dividing_heads_disables_launch_and_apply_fix_repairs_it(main_window, qtbot):
    w = main_window
    pump(qtbot, _plan_settled(w), 20, "first plan")
    # Qwen2.5-7B has 28 attention heads and 4 KV heads: TP 8 does not divide them
    cfg = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=8, disable_custom_all_reduce=True,
                       env={"NCCL_P2P_DISABLE": "1"})
    w.config.set_config(cfg)
    pump(qtbot, lambda: w.plan is not None and "tp_not_divisor_of_heads" in w.plan.problems(), 20,
         "the plan names tp_not_divisor_of_heads")
    assert w.plan.verdict == "error"
    assert not w.act_launch.isEnabled()
    assert "tensor_parallel_size 8" in w.act_launch.toolTip()
    assert "not valid" in w.config.tp.currentText()
    valid = [w.config.tp.itemData(i) for i in range(w.config.tp.count()) if "not valid" not in w.config.tp.itemText(i)]
    assert 8 not in valid and all(28 % t == 0 for t in valid), valid
    btn = w.plan_panel.findChild(QPushButton, "fix_tp_not_divisor_of_heads")
    assert btn is not None and btn.isEnabled()
    btn.click()
    pump(qtbot, lambda: w.plan is not None and "tp_not_divisor_of_heads" not in w.plan.problems()
         and not w.planner._timer.isActive() and not w.planner.busy, 20, "the fix repairs the plan")
    tp = w.config.build_config().tensor_parallel_size or 1
    assert 28 % tp == 0 and tp != 8
    assert w.plan.verdict != "error" and w.act_launch.isEnabled(), w.act_launch.toolTip()


def test_form_error_disables_launch_with_reason(main_window, qtbot):
    w = main_window
    w.config.env.setPlainText("NOT A VARIABLE")
    pump(qtbot, lambda: w.plan_error is not None, 10, "a form error is reported")
    assert not w.act_launch.isEnabled()
    assert "environment line 1" in w.act_launch.toolTip()
    w.config.env.setPlainText("NCCL_P2P_DISABLE=1")
    pump(qtbot, lambda: w.act_launch.isEnabled(), 20, "Launch comes back once the form is fixed")


def test_engine_switch_shows_matching_fields(main_window, qtbot):
    w = main_window
    w.config.set_engine("attach", attach_url="http://127.0.0.1:9")
    assert w.config.attach_url.isVisibleTo(w) and not w.config.sim_row.isVisibleTo(w)
    assert not w.config.gpu_box.isVisibleTo(w)
    assert w.act_launch.text() == "&Connect"
    w.config.set_engine("vllm")
    assert w.config.gpu_box.isVisibleTo(w) and not w.config.attach_url.isVisibleTo(w)
    w.config.set_engine("sim", "RTX 5090", 4)
    assert w.config.sim_row.isVisibleTo(w) and w.config.sim_rig().argv()[:4] == ["--sim-gpu", "RTX 5090",
                                                                            "--sim-gpu-count", "4"]
    # a profile's hidden true rig (--sim-perturb) travels with the form's card and count
    w.config.set_engine("sim", "RTX 4090", 8, sim_rig=SimRig(seed=3, perturb=7))
    assert w.config.sim_rig().argv() == ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "8", "--sim-seed", "3",
                                         "--sim-perturb", "7"]


def test_the_rigs_cooling_and_ambient_rows_come_from_its_declaration(main_window, qtbot):
    """The form's sim rows for cooling and the room's temperature: generated from the
    rig's declaration (SimRig's SimOption), filled from a profile's sim: block, written to
    the sim server's argv and the saved profile; a bad value is the form's error, named by
    the option, and Launch waits for a fix."""
    from app.profiles.model import SIM_RIG_OPTIONS

    w = main_window
    labelled = [n for n, o in SIM_RIG_OPTIONS.items() if o.label]
    assert labelled == ["time_scale", "cooling", "ambient_c"] and set(w.config.sim_options) == set(labelled)
    w.config.set_engine("sim", "RTX 4090", 8, sim_rig=SimRig(seed=3, cooling="2", ambient_c=45))
    pump(qtbot, lambda: w.act_launch.isEnabled(), 20, "the demo rig can launch")
    assert all(ed.isVisibleTo(w) for ed in w.config.sim_options.values())
    assert w.config.sim_options["cooling"].currentText() == "2" and w.config.sim_options["ambient_c"].text() == "45.0"
    assert w.config.sim_rig().argv()[-4:] == ["--sim-cooling", "2", "--sim-ambient-c", "45.0"]
    saved = w.config.to_profile()["sim"]
    assert (saved["cooling"], saved["ambient_c"], saved["seed"]) == ("2", 45.0, 3)
    w.config.sim_options["cooling"].setCurrentText("poor")
    w.config.sim_options["ambient_c"].setText("")
    rig = w.config.sim_rig()
    assert rig.cooling == "poor" and rig.ambient_c is None and "--sim-ambient-c" not in rig.argv()
    w.config.sim_options["ambient_c"].setText("99")
    pump(qtbot, lambda: w.plan_error is not None, 10, "a form error is reported")
    assert "--sim-ambient-c" in w.act_launch.toolTip() and not w.act_launch.isEnabled()
    w.config.sim_options["ambient_c"].setText("30")
    pump(qtbot, lambda: w.act_launch.isEnabled(), 20, "Launch comes back once the row is fixed")
    w.config.set_engine("vllm")
    assert not any(ed.isVisibleTo(w) for ed in w.config.sim_options.values())


def test_geometry_and_last_profile_are_remembered(gui_guard, qtbot, dyno_home):
    from widgets.main_window import MainWindow

    w = MainWindow()
    w.show()
    w.resize(760, 580)  # the offscreen screen is 800×600: restoreGeometry keeps a window on screen
    QApplication.processEvents()
    size = (w.width(), w.height())
    w.config.max_num_seqs.setValue(48)
    w.save_profile("my-rig")
    assert (dyno_home / "profiles" / "my-rig.yaml").is_file()
    w.close()
    w.shutdown()
    w.deleteLater()
    assert (dyno_home / "gui.ini").is_file()
    w2 = MainWindow()
    w2.show()
    try:
        assert w2.config.profile.currentText() == "my-rig"
        assert w2.config.max_num_seqs.value() == 48
        assert (w2.width(), w2.height()) == size
    finally:
        w2.close()
        w2.shutdown()
        w2.deleteLater()


def test_window_opens_fast_without_blocking_io(gui_guard, qtbot):
    """Construction does no NVML, subprocess or HTTP call (those run on background threads);
    a generous bound catches a blocking call without timing the machine (see benchmarks)."""
    from widgets.main_window import MainWindow

    t0 = time.perf_counter()
    w = MainWindow(restore=False)
    w.show()
    dt = time.perf_counter() - t0
    try:
        assert dt < 10, f"the window took {dt:.1f} s to open"
        pump(qtbot, lambda: "detecting" not in w.gpus_label.text(), 20, "GPU detection finishes in the background")
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()


def test_settings_dialog_checks_the_interpreter(gui_guard, qtbot, tmp_path):
    from app.settings import Settings
    from widgets.settings_dialog import SettingsDialog

    dlg = SettingsDialog(Settings())
    qtbot.addWidget(dlg)
    dlg.python.setText(str(tmp_path / "no-such-python"))
    dlg.check_interpreter()
    pump(qtbot, lambda: "✗" in dlg.python_status.text(), 20, "a missing interpreter is reported")
    assert "does not exist" in dlg.python_status.text()
    dlg.fail.setValue(35)
    dlg.margin.setValue(5)
    s = dlg.result_settings()
    assert s.safety.max_failure_rate == pytest.approx(0.35) and s.safety.thermal_margin_c == 5
    dlg.thread.join(5)
    dlg.close()


def test_log_pane_follow_search_errors_copy(gui_guard, qtbot):
    from widgets.log_pane import ERROR_RE, LogPane

    lines = [(0.0, "stdout", f"INFO line {i}") for i in range(200)]
    lines.insert(120, (0.0, "stderr", "ERROR 12-01 [core.py:1] ValueError: No available memory for the cache blocks"))
    feed = [lines]
    pane = LogPane(lambda: feed.pop() if feed else [])
    qtbot.addWidget(pane)
    pane.show()
    pane.pull()
    assert pane.view.blockCount() == 201
    sb = pane.view.verticalScrollBar()
    assert sb.value() == sb.maximum()  # following
    pane.search.setText("No available memory")
    assert pane.matches.text() == "1 match"
    assert pane.find()
    assert not pane.follow.isChecked()  # searching stops following
    pane.errors_only.setChecked(True)
    assert pane.view.blockCount() == 1 and ERROR_RE.search(pane.view.toPlainText())
    pane.errors_only.setChecked(False)
    pane.view.selectAll()
    pane.copy()
    assert "INFO line 199" in QApplication.clipboard().text()
    pane.close()


def test_ramp_form_endpoint_and_prompts_file_survive_a_profile_round_trip(main_window, tmp_path):
    """What the ramp form holds is what a saved profile holds: the chat endpoint and a
    prompts file too, not only levels, lengths and SLO."""
    from app.profiles.model import Profile

    w = main_window
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"messages": [{"role": "user", "content": "hello"}]}\n')
    w.ramp.endpoint.setCurrentText("/v1/chat/completions")
    w.ramp.prompts_file.setText(str(prompts))
    prof = w.form_profile("round trip")
    assert prof.ramp.endpoint == "/v1/chat/completions" and str(prof.ramp.prompts_file) == str(prompts)
    again = Profile.model_validate(prof.to_data())
    w.ramp.endpoint.setCurrentText("/v1/completions")
    w.ramp.prompts_file.clear()
    w.ramp.set_from_profile(again.to_data()["ramp"])
    assert w.ramp.endpoint.currentText() == "/v1/chat/completions"
    assert w.ramp.prompts_file.text() == str(prompts)
    # a profile without them resets the form to the defaults (no stale file from the last one)
    w.ramp.set_from_profile({"max_level": 8})
    assert w.ramp.endpoint.currentText() == "/v1/completions" and w.ramp.prompts_file.text() == ""


def test_form_rows_are_generated_from_the_option_declarations(gui_guard, qtbot):
    """Every option with a form group has a row (label, tooltip = its help text); the
    form round-trips every option, those it does not show included."""
    from app.config import VLLM_OPTIONS
    from tests.unit.test_config import ALL_OPTIONS
    from widgets.config_panel import ConfigPanel

    panel = ConfigPanel()
    qtbot.addWidget(panel)
    assert set(panel.options) == {f for f, s in VLLM_OPTIONS.items() if s.group}
    rows = [(VLLM_OPTIONS[f].group, ed.label) for f, ed in panel.options.items()]
    look = [("Model", "Served name"), ("Parallelism and batching", "Tensor parallel"),
            ("Parallelism and batching", "Pipeline parallel"), ("Parallelism and batching", ""),
            ("Parallelism and batching", "max_num_seqs"), ("Parallelism and batching", "max_num_batched_tokens"),
            ("Parallelism and batching", "max_model_len"), ("Precision and memory", "Quantization"),
            ("Precision and memory", "dtype"), ("Precision and memory", "kv_cache_dtype"),
            ("Precision and memory", "GPU memory util."), ("Precision and memory", "Prefix caching"),
            ("Precision and memory", "")]
    it = iter(rows)
    assert all(row in it for row in look), f"the form's rows changed order or labels: {rows}"
    import html
    for f, ed in panel.options.items():
        tip = ed.widget.toolTip()
        assert f"<td><b>{f}</b>: {html.escape(VLLM_OPTIONS[f].help, quote=False)}" in tip, (f, tip)
        assert f"vllm serve {VLLM_OPTIONS[f].flag}" in tip, f
    assert panel.options["enforce_eager"].widget.text() == "enforce eager (no CUDA graphs)"
    panel.set_engine("sim", "RTX 4090", 8)  # 8 cards: TP 2 × PP 2 are offered
    cfg = ServerConfig(model="meta-llama/Meta-Llama-3-70B-Instruct", **ALL_OPTIONS)
    panel.set_config(cfg)
    assert panel.build_config() == cfg
    assert panel.to_profile()["server"] == cfg.to_vllm_config()
    panel.set_config(ServerConfig(model="m", kv_cache_dtype="fp8_e4m3", quantization="my-method"))
    got = panel.build_config()
    assert got.kv_cache_dtype == "fp8_e4m3" and got.quantization == "my-method" and got.data_parallel_size is None
    assert got.max_num_seqs is None and got.gpu_memory_utilization is None and got.dtype is None
    # an unset gpu_memory_utilization stays unset: vLLM's default differs by version (0.9, 0.92)


def test_the_configuration_and_the_plan_live_in_one_state_object(main_window, qtbot):
    """The form writes its configuration into the window's RigState; a change made there
    (Apply fix) shows in the form; the plan panel, the Curves overlay and Launch follow
    the state's plan."""
    w = main_window
    pump(qtbot, _plan_settled(w), 20, "first plan")
    assert w.state.config == w.config.build_config() and w.plan is w.state.plan
    w.config.options["max_num_seqs"].set_value(48)
    w.config.changed.emit()
    assert w.state.config.max_num_seqs == 48
    pump(qtbot, lambda: _plan_settled(w)() and w.plan.config.max_num_seqs == 48, 20, "replanned for 48")
    w.state.set_config(w.state.config.model_copy(update={"max_num_seqs": 24}))  # as Apply fix does
    assert w.config.build_config().max_num_seqs == 24
    pump(qtbot, lambda: _plan_settled(w)() and w.plan.config.max_num_seqs == 24, 20, "replanned for 24")
    assert w.curves.pred_tput.xData is not None
    # a form that does not validate: no configuration, the plan panel says why, Launch is off
    w.config.model.setCurrentText("")
    w.config.changed.emit()
    assert w.state.config is None and "model" in (w.state.config_error or "")
    pump(qtbot, lambda: w.plan is None and w.plan_error is not None and w.plan_error[1], 20, "the form error")
    assert not w.act_launch.isEnabled()


def test_gpu_table_says_what_the_used_memory_holds(gui_guard, qtbot):
    """NVML memory info v2 keeps the driver's reservation apart from used; where the driver
    has only v1, the table says its figure includes it and the tooltip says why."""
    from app.telemetry.gpu_source import GpuReading
    from widgets.config_panel import GpuTable

    g = 2**30
    v2 = GpuReading(index=0, name="NVIDIA GeForce RTX 4090", memory_total_bytes=24 * g, memory_used_bytes=g,
                    memory_reserved_bytes=g // 2, memory_free_bytes=24 * g - 3 * g // 2)
    v1 = GpuReading(index=1, name="NVIDIA GeForce RTX 4090", memory_total_bytes=24 * g, memory_used_bytes=3 * g // 2,
                    memory_free_bytes=24 * g - 3 * g // 2, unavailable={"memory_reserved_bytes": "function not found"})
    t = GpuTable()
    qtbot.addWidget(t)
    t.set_readings([v2, v1], "")
    assert t.item(0, 2).text() == "1.0 / 24.0 GiB" and "0.50 GiB reserved by the driver" in t.item(0, 2).toolTip()
    assert t.item(1, 2).text() == "1.5 / 24.0 GiB (incl. reserved)"
    assert "NVML memory info v2 is not available (function not found)" in t.item(1, 2).toolTip()


def test_option_tooltips_teach_the_default_for_this_vllm_and_the_planners_advice(main_window, qtbot):
    """Issue 19, item 5: once planned, every option's tooltip adds vLLM's default for the
    version and cards of the plan, and the planner's advice where it has some (a fix it
    proposes for the option, the plan's figures that depend on it)."""
    w = main_window
    pump(qtbot, _plan_settled(w), 20, "the demo profile is planned")
    for f, ed in w.config.options.items():
        assert "<b>Default</b>:" in ed.widget.toolTip(), f
    seqs = w.config.options["max_num_seqs"].widget.toolTip()
    # the demo rig: 8 × RTX 4090 (24 GiB) in the sim, which plans with vLLM 0.32's rules
    assert "<b>Default</b>: 256 (vLLM 0.32" in seqs and "RTX 4090 24 GiB" in seqs, seqs
    assert "Planner" in seqs and "concurrent users at the Ramp tab" in seqs and "per engine, limited by" in seqs
    util = w.config.options["gpu_memory_utilization"].widget.toolTip()
    assert "<b>Default</b>: 0.92" in util and "the KV cache holds" in util, util
    # a max_model_len that does not fit: the advice names the fix the Plan tab offers
    cfg = w.state.config.model_copy(update={"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": None,
                                            "tensor_parallel_size": 1, "gpu_memory_utilization": 0.5})
    w.config.set_config(cfg)
    pump(qtbot, lambda: w.plan is not None and "context_exceeds_kv_cache" in w.plan.problems()
         and not w.planner.busy, 30, "the plan says the context does not fit")
    tip = w.config.options["max_model_len"].widget.toolTip()
    fix = w.plan.fix["max_model_len"]
    assert "131,072 tokens (the model's max_position_embeddings)" in tip and f"Fix: max_model_len {fix:,}" in tip, tip


def test_the_speculative_decoding_row_offers_method_draft_and_tokens(gui_guard, qtbot):
    """The --speculative-config row: method, draft model (off for ngram/suffix), k; keys
    it does not show are kept; a method that needs a draft without one is refused by
    the form naming the key; "off" unsets the option."""
    from widgets.config_panel import ConfigPanel

    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    panel = ConfigPanel()
    qtbot.addWidget(panel)
    ed = panel.options["speculative_config"]
    assert ed.label == "Speculative decoding" and not ed.tokens.isEnabled()
    panel.set_config(ServerConfig(model="m", speculative_config=ngram))
    assert ed.method.currentData() == "ngram" and not ed.draft.isEnabled() and ed.tokens.value() == 2
    assert panel.build_config().speculative_config == ngram
    ed.method.setCurrentIndex(ed.method.findData("eagle"))
    assert ed.draft.isEnabled()
    with pytest.raises(ValueError, match=r"speculative_config.*needs a draft"):
        panel.build_config()
    ed.draft.setText("yuhuili/EAGLE-LLaMA3-Instruct-8B")
    ed.tokens.setValue(4)
    assert panel.build_config().speculative_config == {
        "method": "eagle", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}
    ed.method.setCurrentIndex(0)
    assert panel.build_config().speculative_config is None
