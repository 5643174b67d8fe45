"""The main window: menu, toolbar, status bar; the form and the ramp on the left; the
plan, live dashboard, curves, results, tune and log on the right. A tune (the Tune tab)
launches through the window's run controller, so the other tabs follow its launches;
while it runs, Launch, Run ramp and the form wait for it.

Opens without blocking I/O: GPU detection (NVML), the vLLM version probe and the
catalogs load on background threads and fill the form when they arrive. Geometry is
kept in QSettings (``gui.ini`` in the data dir: presentation only); the last profile in
``settings.yaml`` (app.settings).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from importlib import resources
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QGuiApplication, QIcon, QKeySequence, QPixmap
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QDialog,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSplitter,
    QStyle,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.config import exposure_lines, exposure_problem
from app.engines import Engine
from app.hosts.preview import rig_preview
from app.loadgen.spec import parse_length
from app.paths import data_dir
from app.planner.gpus import catalog_names
from app.profiles.env_policy import screen_env
from app.profiles.model import variant_name
from app.planner.models import catalog_ids
from app.planner.option_help import option_notes
from app.planner.plan import apply_fix
from app.planner.versions import installed_version, rules_for
from app.run.controller import RecordSpec
from app.run.target import LaunchTarget, launch_target
from app.server.procs import end_leftovers, find_leftovers
from app.settings import load_settings, save_settings
from app.store import RunStore
from app.tuner.report import TuneStart
from app.telemetry.nvml_source import NvmlSource
from widgets import profiles
from widgets.compare_view import CompareView
from widgets.config_panel import ConfigPanel
from widgets.dashboard import Dashboard
from widgets.diagnosis_banner import DiagnosisBanner
from widgets.first_run import FirstRunStrip
from widgets.fit import SplitKeeper, narrow_combos
from widgets.history_view import HistoryView
from widgets.hosts_view import HostsView
from widgets.log_pane import LogPane
from widgets.plan_panel import PlanInputs, PlanPanel, PlanRunner
from widgets.profile_manager import ProfileManager
from widgets.ramp_panel import RampPanel
from widgets.results import CurvesView, ResultsTable
from widgets.rig_plan_dialog import RigPlanDialog
from widgets.rig_state import RigState
from widgets.run_adapter import ATTACHED, RunAdapter
from widgets.settings_dialog import SettingsDialog
from widgets.help_dialog import PAGES, HelpDialog, page_html, shortcuts_html
from widgets.tasks import run_in_background
from widgets.tune_panel import TunePanel

log = logging.getLogger(__name__)

STATE_COLORS = {"idle": "#777", "starting": "#c98a00", "loading": "#c98a00", "ready": "#1e7b34",
                "attached": "#1e7b34", "stopping": "#c98a00", "stopped": "#777", "failed": "#a61b1b"}


#: the form column's width until the user drags the splitter, px
LEFT_WIDTH = 460
#: the window's size on a screen large enough for it, px; at most SCREEN_SHARE of a smaller one
PREFERRED_SIZE = (1600, 1000)
SCREEN_SHARE = 0.94


def _truthy(v) -> bool:
    """A QSettings value read back from gui.ini (``true`` is read as the string "true")."""
    return v is True or str(v).lower() in ("true", "1")


def gui_settings() -> QSettings:
    """QSettings stored as ``gui.ini`` in the data directory (VLLM_DYNO_HOME honoured;
    made when it can be — a read-only home keeps the window's state for the session)."""
    try:
        d = data_dir(create=True)
    except OSError:
        d = data_dir()
    return QSettings(str(d / "gui.ini"), QSettings.IniFormat)


class MainWindow(QMainWindow):
    """The application window. ``sim_time_scale`` (tests, benchmarks) speeds the sim up."""

    def __init__(self, restore: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("vLLM Dyno")
        self.setWindowIcon(app_icon())
        self.settings = load_settings()
        self.sim_time_scale = 1.0
        self.state = RigState(self)  # the form's configuration and its plan: the one truth
        self.gpu_readings: list = []
        self.nvml_ok = False
        self.vllm_version: str | None = None
        self.background: list = []
        self._first_run = True
        self._closed = False
        self._verify_spec = None  # the Tune tab's Verify: the capacity search to run once its launch is ready
        self._saved_snapshot: Any = None  # the forms as the loaded profile (see _mark_saved)
        self._base_profile: Any = None  # the loaded profile itself
        self._snapshot_taken = False
        self.controller = RunAdapter(self, store_fn=self.run_store)
        self.current_profile = None  # app.profiles.Profile loaded into the form
        self.profile_name = profiles.DEMO_NAME
        self._store = None
        self._store_lock = threading.Lock()

        # ---- panels
        self.config = ConfigPanel()
        self.ramp = RampPanel(self.controller.clock.now)
        self.ramp.set_safety(self.settings.safety)
        left = QTabWidget()
        left.addTab(self.config, "Server")
        left.addTab(self.ramp, "Ramp")
        self.left_tabs = left
        self.plan_panel = PlanPanel()
        self.dashboard = Dashboard(lambda: self.controller.bank, lambda: self.controller.client,
                                   self.controller.clock.now)
        #: how a rig's hosts are reached (app.hosts.link.SshOptions; None: the user's SSH agent,
        #: ~/.ssh/config and known hosts) — every launch and tune over a profile's hosts
        self.ssh_options = None
        self.hosts_view = HostsView(STATE_COLORS)  # a rig's hosts, above the Live plots (issue 21)
        self.hosts_view.hide()
        self.dashboard.layout().insertWidget(0, self.hosts_view)
        self.dashboard.timer.timeout.connect(self._refresh_hosts)
        self.curves = CurvesView()
        self.results = ResultsTable(self._energy_per_token)
        self.log_pane = LogPane(self.controller.take_lines)
        self.banner = DiagnosisBanner()
        right = QTabWidget()
        right.addTab(self.plan_panel, "Plan")
        right.addTab(self.dashboard, "Live")
        right.addTab(self.curves, "Curves")
        right.addTab(self.results, "Results")
        self.tune = TunePanel(self.tune_start, lambda: self.controller.core, self.run_store,
                              lambda: self.settings.pricing, block_fn=self.tune_block_reason,
                              confirm_fn=self.tune_confirm)
        right.addTab(self.tune, "Tune")
        right.addTab(self.log_pane, "Log")
        self.profile_manager = ProfileManager(self.form_profile, profiles.library)
        self.history = HistoryView(self.run_store, profiles.library)
        self.compare = CompareView(self.run_store)
        self.compare.set_pricing(self.settings.pricing)
        right.addTab(self.profile_manager, "Profiles")
        right.addTab(self.history, "History")
        right.addTab(self.compare, "Compare")
        right.setUsesScrollButtons(False)  # the bold selected tab would otherwise push the last one behind arrows
        self.tabs = right
        rw = QWidget()
        rv = QVBoxLayout(rw)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(self.banner)
        rv.addWidget(right, 1)
        split = QSplitter(Qt.Horizontal)
        split.addWidget(left)
        split.addWidget(rw)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([LEFT_WIDTH, 1100])
        self.splitter = split
        #: the form column keeps the width the user dragged it to (never one a wide tab forced)
        self.split_keeper = SplitKeeper(split, LEFT_WIDTH)
        self.first_run = FirstRunStrip()
        central = QWidget()
        cv = QVBoxLayout(central)
        cv.setContentsMargins(4, 4, 4, 0)
        cv.setSpacing(4)
        cv.addWidget(self.first_run)
        cv.addWidget(split, 1)
        self.setCentralWidget(central)

        self._build_actions()
        self._build_status_bar()
        narrow_combos(right)  # a long run or model name in a combo box must not widen a tab (issue 37)

        # ---- wiring
        c = self.controller
        c.state_changed.connect(self._on_state)
        c.launch_failed.connect(self._on_launch_failed)
        c.leftovers_found.connect(self._on_leftovers)
        c.stopped.connect(self._on_stopped)
        c.ramp_started.connect(self._on_ramp_started)
        c.level_started.connect(self.ramp.level_started)
        c.level_started.connect(self._on_level_started)
        c.level_done.connect(self._on_level_done)
        c.records_added.connect(self.ramp.records_added)
        c.ramp_finished.connect(self._on_ramp_finished)
        c.safety_stop.connect(lambda r: None if self._closed else self.statusBar().showMessage(r, 15000))
        c.run_recorded.connect(self._on_run_recorded)
        c.record_failed.connect(lambda r: None if self._closed else self.statusBar().showMessage(r, 15000))
        self.profile_manager.use_requested.connect(lambda n: self.load_profile(n))
        self.profile_manager.profiles_changed.connect(lambda n: self._refresh_profile_list(self.profile_name))
        self.history.profile_saved.connect(self._on_profile_saved_from_run)
        self.history.compare_requested.connect(self.compare_runs)
        self.planner = PlanRunner(self)
        self.planner.planned.connect(self.state.set_plan)
        self.planner.failed.connect(self.state.set_plan_error)
        self.state.plan_changed.connect(self._on_plan_changed)
        self.state.config_changed.connect(self._on_config_changed)
        self.config.changed.connect(self._form_changed)
        self.config.profile_selected.connect(self.switch_profile)
        self.config.save_profile_requested.connect(self.save_profile_dialog)
        self.plan_panel.apply_fix.connect(self.apply_fix)
        self.banner.apply_fix.connect(self.apply_fix)
        self.banner.show_evidence.connect(self.show_evidence)
        self.ramp.run_requested.connect(self.run_ramp)
        self.ramp.abort_requested.connect(self.abort_ramp)
        self.ramp.shape_changed.connect(self._replan)  # the plan predicts the Ramp tab's ramp and SLO
        self.ramp.shape_changed.connect(self._update_modified)
        self.tune.running_changed.connect(self._on_tune_running)
        self.tune.profile_saved.connect(self._on_tune_profile_saved)
        self.tune.launch_requested.connect(self.launch_tuned)
        self.tune.verify_requested.connect(self.verify_tuned)

        # ---- initial state (no blocking I/O)
        self.qsettings = gui_settings()
        geo = self.qsettings.value("geometry") if restore else None
        if geo is None or not self.restoreGeometry(geo):
            self.fit_to_screen()
        else:
            self.fit_to_screen(keep_smaller=True)  # saved on a larger screen than this one
        if restore:
            self.split_keeper.restore(self.qsettings.value("splitter/left_width"))
        if _truthy(self.qsettings.value("onboarding/done")):
            self.first_run.hide()
        self.first_run.finished.connect(lambda: self.qsettings.setValue("onboarding/done", True))
        last = self.settings.last_profile if restore else None
        self._first_run = last is None
        self._refresh_profile_list(last or profiles.DEMO_NAME)
        self.load_profile(last or profiles.DEMO_NAME, quiet=True)
        self._update_controls()
        if self.settings.load_error:  # a bad settings.yaml: the window opens on defaults and says why
            self.statusBar().showMessage("Settings: " + self.settings.load_error.splitlines()[0], 60000)
        self.dashboard.start()
        self.log_pane.start()
        self._start_probes()

    # ------------------------------------------------------------------ building
    def _build_actions(self) -> None:
        st = self.style()
        self.act_launch = QAction(st.standardIcon(QStyle.SP_MediaPlay), "&Launch", self)
        self.act_launch.setShortcut(QKeySequence("Ctrl+L"))
        self.act_launch.triggered.connect(self.launch)
        self.act_stop = QAction(st.standardIcon(QStyle.SP_MediaStop), "&Stop", self)
        self.act_stop.setShortcut(QKeySequence("Ctrl+."))
        self.act_stop.triggered.connect(self.stop)
        self.act_ramp = QAction(st.standardIcon(QStyle.SP_MediaSeekForward), "Run &ramp", self)
        self.act_ramp.setShortcut(QKeySequence("Ctrl+R"))
        self.act_ramp.triggered.connect(self.run_ramp)
        self.act_abort = QAction(st.standardIcon(QStyle.SP_BrowserStop), "&Abort ramp", self)
        self.act_abort.triggered.connect(self.abort_ramp)
        self.act_settings = QAction(st.standardIcon(QStyle.SP_FileDialogDetailedView), "Se&ttings…", self)
        self.act_settings.setShortcut(QKeySequence.Preferences)
        self.act_settings.triggered.connect(self.open_settings)
        self.act_save = QAction(st.standardIcon(QStyle.SP_DialogSaveButton), "&Save profile…", self)
        self.act_save.setShortcut(QKeySequence.Save)
        self.act_save.triggered.connect(self.save_profile_dialog)
        self.act_cleanup = QAction("&Clean up leftover vLLM processes…", self)
        self.act_cleanup.triggered.connect(self.cleanup_leftovers)
        self.act_refresh_gpus = QAction(st.standardIcon(QStyle.SP_BrowserReload), "Re&detect GPUs", self)
        self.act_refresh_gpus.triggered.connect(self._start_gpu_probe)
        act_quit = QAction("&Quit", self)
        act_quit.setShortcut(QKeySequence.Quit if not QKeySequence(QKeySequence.Quit).isEmpty() else QKeySequence("Ctrl+Q"))
        act_quit.triggered.connect(self.close)
        mb = self.menuBar()
        m = mb.addMenu("&File")
        m.addAction(self.act_save)
        m.addAction(self.act_settings)
        m.addSeparator()
        m.addAction(act_quit)
        m = mb.addMenu("&Server")
        m.addAction(self.act_launch)
        m.addAction(self.act_stop)
        m.addSeparator()
        m.addAction(self.act_refresh_gpus)
        m.addAction(self.act_cleanup)
        m = mb.addMenu("&Ramp")
        m.addAction(self.act_ramp)
        m.addAction(self.act_abort)
        m = mb.addMenu("&View")
        for i in range(self.tabs.count()):
            a = QAction(self.tabs.tabText(i), self)
            a.setShortcut(QKeySequence(f"Ctrl+{i + 1}"))
            a.triggered.connect(lambda _=False, i=i: self.tabs.setCurrentIndex(i))
            m.addAction(a)
        m = mb.addMenu("&Help")
        self.help_dialogs: dict[str, HelpDialog] = {}
        for name, text, keys in (("quick_start", "&Quick start", QKeySequence.HelpContents),
                                 ("concepts", "&Concepts: TTFT, TPOT, ITL, goodput, knee", None),
                                 ("shortcuts", "&Keyboard shortcuts", None)):
            a = QAction(text, self)
            if keys is not None:
                a.setShortcut(QKeySequence(keys))
            a.triggered.connect(lambda _=False, n=name: self.show_help(n))
            m.addAction(a)
        m.addSeparator()
        a = QAction("&About vLLM Dyno", self)
        a.triggered.connect(self._about)
        m.addAction(a)
        tb = self.addToolBar("Main")
        tb.setObjectName("mainToolbar")
        tb.setToolButtonStyle(Qt.ToolButtonTextBesideIcon)
        for a in (self.act_launch, self.act_stop, None, self.act_ramp, self.act_abort, None, self.act_settings):
            tb.addSeparator() if a is None else tb.addAction(a)

    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.state_label = QLabel()
        self.gpus_label = QLabel("GPUs: detecting…")
        self.run_label = QLabel("")
        self.run_bar = QProgressBar()
        self.run_bar.setMaximumWidth(160)
        self.run_bar.setFormat("%v/%m levels")
        self.run_bar.hide()
        self.launch_label = QLabel()  # the launch's phase, elapsed and expected time left
        self.launch_label.setObjectName("launchProgress")
        self.launch_label.hide()
        self.launch_timer = QTimer(self)
        self.launch_timer.setInterval(1000)
        self.launch_timer.timeout.connect(self._show_launch_progress)
        sb.addPermanentWidget(self.state_label)
        sb.addPermanentWidget(self.launch_label)
        sb.addPermanentWidget(self.gpus_label)
        sb.addPermanentWidget(self.run_label)
        sb.addPermanentWidget(self.run_bar)
        self._show_state("idle", "")

    def show_help(self, name: str) -> HelpDialog:
        """Open (or raise) a Help page: ``quick_start``, ``concepts`` or ``shortcuts``."""
        dlg = self.help_dialogs.get(name)
        if dlg is None:
            if name == "shortcuts":
                dlg = HelpDialog("Keyboard shortcuts", shortcuts_html(self), self)
            else:
                dlg = HelpDialog(PAGES[name][0], page_html(name), self)
            self.help_dialogs[name] = dlg
        dlg.show()
        dlg.raise_()
        return dlg

    def _about(self) -> None:
        QMessageBox.about(self, "About vLLM Dyno",
                          f"<b>vLLM Dyno {__version__}</b><br>A dynamometer for local vLLM servers: configure, "
                          "launch, ramp and read the knee.<br>Data directory: " + str(data_dir()))

    # ------------------------------------------------------------------ probes (background)
    def _start_probes(self) -> None:
        def catalogs():
            return catalog_names(), catalog_ids()

        self.background.append(run_in_background("catalogs", catalogs, self._on_catalogs,
                                                 lambda e: log.warning("catalogs: %s", e)))
        self._start_gpu_probe()

        def version():
            v = installed_version(self.settings.vllm_python)
            return v, rules_for(v).quantization_methods

        self.background.append(run_in_background("vllm-version", version, self._on_version,
                                                 lambda e: self._on_version((None, []))))

    def _start_gpu_probe(self) -> None:
        def probe():
            src = NvmlSource(None)
            st = src.open()
            try:
                return st, (src.read() if st.ok else [])
            finally:
                src.close()

        self.gpus_label.setText("GPUs: detecting…")
        self.background.append(run_in_background("gpu-probe", probe, self._on_gpus,
                                                 lambda e: self._on_gpus((None, []), str(e))))

    def _on_catalogs(self, res) -> None:
        if self._closed:
            return
        gpus, models = res
        self.config.set_catalogs(gpus, models)

    def _on_gpus(self, res, err: str | None = None) -> None:
        if self._closed:
            return
        status, readings = res
        self.gpu_readings = readings
        self.nvml_ok = bool(status is not None and status.ok and readings)
        if self.nvml_ok:
            text = f"{len(readings)} × {readings[0].name}" if len({r.name for r in readings}) == 1 else \
                f"{len(readings)} GPUs"
            self.gpus_label.setText(f"GPUs: {text}")
            self.config.gpu_table.set_readings(readings, "")
        else:
            why = err or (status.message if status is not None else "NVML not available")
            self.gpus_label.setText("GPUs: none (NVML: " + (why[:60] or "no GPU") + ")")
            self.config.gpu_table.set_readings([], f"No NVIDIA GPU detected: {why}")
        self.gpus_label.setToolTip("\n".join(f"{r.index}: {r.name}" for r in readings) or
                                   "No NVIDIA GPU: the simulated rig works everywhere")
        self._maybe_switch_to_real()
        self._form_changed()

    def _on_version(self, res) -> None:
        if self._closed:
            return
        v, methods = res
        self.vllm_version = v
        if methods:
            self.config.set_quantization_methods(methods, f"vLLM {v}" if v else "built-in list, newest version")
        self._maybe_switch_to_real()
        self._form_changed()

    def _maybe_switch_to_real(self) -> None:
        """First run on a machine with NVIDIA GPUs and vLLM: start on the real engine."""
        if self._first_run and self.nvml_ok and self.vllm_version and self.config.engine_key().simulated \
                and not self.controller.server_running:
            self._first_run = False
            self.config.set_engine(Engine.VLLM)

    # ------------------------------------------------------------------ profiles
    def _refresh_profile_list(self, current: str | None = None) -> None:
        combo = self.config.profile
        combo.blockSignals(True)
        combo.clear()
        try:
            names = profiles.list_profiles()
        except OSError:
            names = [profiles.DEMO_NAME]
        combo.addItems(names)
        if current and current in names:
            combo.setCurrentText(current)
        combo.blockSignals(False)

    def load_profile(self, name: str, quiet: bool = False) -> bool:
        """Show profile ``name`` in the forms (a bad profile is reported, never fatal; the
        demo is loaded instead)."""
        try:
            entry = profiles.library().entry(name)
            prof = self._screen_env(entry.profile, entry.read_only, quiet)
            profiles.apply_to_form(prof, self.config, self.ramp)
        except Exception as e:  # a bad or missing profile file is reported, never fatal
            if not quiet:
                QMessageBox.warning(self, "Profile", f"Cannot load profile {name!r}: {e}")
            if name != profiles.DEMO_NAME:
                return self.load_profile(profiles.DEMO_NAME, quiet=True)
            return False
        self.current_profile = prof
        self.profile_name = prof.name
        self.reset_session_views()
        if self.config.profile.findText(prof.name) < 0:
            self._refresh_profile_list(prof.name)
        self.config.profile.setCurrentText(prof.name)
        self._form_changed()
        self._mark_saved()
        try:
            self.tune.set_defaults(self.tune_start())
        except ValueError:
            pass  # the form does not validate: the Tune tab keeps its values
        return True

    # ------------------------------------------------------------------ unsaved edits
    def _form_snapshot(self) -> Any:
        """The forms as the loaded profile would be saved (its results and notes aside);
        None while a field does not validate."""
        try:
            p = self.form_profile(self.profile_name or "profile")
        except ValueError:
            return None
        return p.model_dump(mode="json", exclude={"results", "notes", "description", "hardware"})

    def _mark_saved(self) -> None:
        """The forms now hold the loaded (or just saved) profile: not modified."""
        self._saved_snapshot = self._form_snapshot()
        try:  # what a run's name is told apart from (variant_name)
            self._base_profile = self.form_profile(self.profile_name or "profile")
        except ValueError:
            self._base_profile = None
        self._snapshot_taken = True
        self.setWindowTitle(f"vLLM Dyno — {self.profile_name}[*]")  # [*]: Qt's modified marker
        self.setWindowModified(False)

    def is_modified(self) -> bool:
        """Whether the forms differ from the loaded profile (a field that does not
        validate counts as an edit)."""
        return self._snapshot_taken and self._form_snapshot() != self._saved_snapshot

    def _update_modified(self, *_: Any) -> None:
        if not self._closed:
            self.setWindowModified(self.is_modified())

    def _ask(self, title: str, text: str, buttons, default):
        """A question to the user (tests answer it by patching this method)."""
        return QMessageBox.question(self, title, text, buttons, default)

    def reset_session_views(self) -> None:
        """Another profile or engine: the last session's ramp progress, plots, results and
        run label go (not while a server or a tune runs: those are still this session's)."""
        if self.controller.server_running or self.tuning or self.controller.ramp_running:
            return
        self.ramp.reset_progress()
        self.dashboard.reset()
        self.results.clear()
        self.curves.set_measured([])
        self.run_label.setText("")
        self.run_bar.hide()
        self._show_state("idle", "")  # not the last server's "sim: stopped" under another engine

    def switch_profile(self, name: str) -> bool:
        """Load profile ``name`` from the profile box; with unsaved edits to the loaded
        one, ask first: Save (then switch), Discard (switch), Cancel (stay, the box shows
        the loaded profile again). Returns whether it switched."""
        modified = self.is_modified()
        if name == self.profile_name and not modified:
            return False
        if modified:
            ans = self._ask("Unsaved edits", f"The form has edits that are not saved to profile "
                            f"{self.profile_name!r}. Switching to {name!r} discards them.",
                            QMessageBox.Save | QMessageBox.Discard | QMessageBox.Cancel, QMessageBox.Cancel)
            if ans == QMessageBox.Cancel:
                self.config.profile.setCurrentText(self.profile_name)
                return False
            if ans == QMessageBox.Save:
                self.save_profile_dialog()
                if self.is_modified():  # the save was cancelled or failed: stay
                    self.config.profile.setCurrentText(self.profile_name)
                    return False
        return self.load_profile(name)

    def close_question(self) -> str | None:
        """What closing now would end or lose, in words (None: nothing)."""
        c = self.controller
        what = []
        if self.tuning:
            what.append("a tune is running (it is saved and can be resumed)")
        elif c.ramp_running:
            what.append("a ramp is running (the level in progress is kept as partial)")
        if c.server_running or c.supervisor is not None:
            what.append(f"the server is {c.state} and will be stopped")
        if self.is_modified():
            what.append(f"the form has edits not saved to profile {self.profile_name!r}")
        return "; ".join(what) if what else None

    def _screen_env(self, prof, builtin: bool, quiet: bool):
        """``prof`` with the ``env:`` keys the user allows (app.profiles.env_policy): keys a
        shared profile may not set unconfirmed are shown with their exact values; declined,
        or a quiet load (the last profile at start-up), loads the profile without them."""
        scr = screen_env(prof.env, builtin=builtin)
        if not scr.refused and not scr.notes:
            return prof
        keep = dict(scr.env)
        msgs = list(scr.notes)
        if scr.refused:
            text = "\n".join(f"{k}={v}\n    ({why})" for k, (v, why) in scr.refused.items())
            ok = not quiet and QMessageBox.question(
                self, "Profile environment",
                f"Profile {prof.name!r} sets variables that can run code or send data elsewhere:\n\n{text}\n\n"
                "Use these exact values for the server?", QMessageBox.Yes | QMessageBox.No,
                QMessageBox.No) == QMessageBox.Yes
            if ok:
                keep.update({k: v for k, (v, _) in scr.refused.items()})
            else:
                msgs.append("not loaded from env: " + ", ".join(scr.refused))
        if msgs:
            self.statusBar().showMessage("; ".join(msgs), 15000)
        return prof.updated(env={k: v for k, v in prof.env.items() if k in keep})

    def form_profile(self, name: str, base=None):
        """The forms as a profile called ``name`` (``base``: the profile whose notes and —
        for unchanged settings — results to keep; default the loaded one when the name
        matches). The rig's ``hosts:`` are always the loaded profile's, the ones Launch
        starts (:meth:`build_request`), under any name. Raises ValueError naming the field."""
        loaded = self.current_profile
        if base is None and loaded is not None and loaded.name == name:
            base = loaded
        return profiles.form_profile(name, self.config, self.ramp, base,
                                     hosts=list(loaded.hosts) if loaded is not None else [],
                                     ray_address=loaded.ray_address if loaded is not None else None)

    def save_profile_dialog(self) -> None:
        name, ok = QInputDialog.getText(self, "Save profile", "Profile name (a built-in's name makes a user copy):",
                                        text=self.profile_name or "")
        if ok and name.strip():
            self.save_profile(name.strip())

    def save_profile(self, name: str) -> None:
        """Save the forms as the user profile ``name`` (atomic; a built-in gets a user copy)."""
        try:
            prof = self.form_profile(name)
            path = profiles.library().save(prof)
        except (ValueError, OSError) as e:
            QMessageBox.warning(self, "Save profile", f"Cannot save the profile: {e}")
            return
        self.current_profile = prof
        self.profile_name = prof.name
        self._refresh_profile_list(prof.name)
        if self.profile_manager._loaded:
            self.profile_manager.refresh(prof.name)
        self._mark_saved()
        self.statusBar().showMessage(f"Saved {path}", 5000)

    def _on_profile_saved_from_run(self, name: str) -> None:
        self._refresh_profile_list(self.profile_name)
        if self.profile_manager._loaded:
            self.profile_manager.refresh(name)
        self.statusBar().showMessage(f"Saved the run as profile {name!r} (Profiles tab)", 8000)

    # ------------------------------------------------------------------ run store
    def run_store(self):
        """The run store (opened on first use; closed by :meth:`shutdown`). Thread-safe."""
        with self._store_lock:
            if self._closed and self._store is None:
                raise RuntimeError("the window is closed")
            if self._store is None:
                self._store = RunStore()
            return self._store

    def _on_run_recorded(self, run_id: int) -> None:
        if self._closed:
            return
        if self.history._loaded:
            self.history.refresh()
        if self.compare._loaded:
            self.compare.refresh_runs()
        self.statusBar().showMessage(f"Run #{run_id} recorded (History tab)", 8000)

    def compare_runs(self, ids: list[int]) -> None:
        """Show the comparison of runs ``ids``."""
        self.compare.set_runs(ids)
        self.tabs.setCurrentWidget(self.compare)

    # ------------------------------------------------------------------ plan
    @property
    def plan(self):
        """The plan of the form's configuration (:class:`widgets.rig_state.RigState`)."""
        return self.state.plan

    @property
    def plan_error(self) -> tuple[str, bool] | None:
        return self.state.plan_error

    def _form_changed(self, *_: Any) -> None:
        """The form changed: its configuration into the state, then a new plan."""
        if self._closed:
            return
        eng = self.config.engine_key()
        if eng != getattr(self, "_engine_shown", eng):  # another engine: a new session's views
            self.reset_session_views()
        self._engine_shown = eng
        try:
            cfg = self.config.build_config()
            if eng.simulated:
                self.config.sim_rig()  # the rig's rows (cooling, ambient) are checked as the flags are
            self.state.set_config(cfg)
        except ValueError as e:
            self.state.set_config_error(str(e))
        self._replan()
        self.tune.mark_stale()
        self._update_modified()

    def _on_config_changed(self, cfg) -> None:
        """The state's configuration changed (a fix applied): the form shows it."""
        if cfg is None or self._closed:
            return
        try:
            same = self.config.build_config() == cfg
        except ValueError:
            same = False
        if not same:
            self.config.set_config(cfg)

    def _plan_inputs(self) -> PlanInputs:
        cfg = self.state.config
        if cfg is None:
            raise ValueError(self.state.config_error or "the form is not complete")

        def mid(text: str, default: int) -> int:
            try:
                v = parse_length(text)
            except ValueError:
                return default
            return (v[0] + v[1]) // 2 if isinstance(v, tuple) else v

        return PlanInputs(cfg, self.config.engine_key(), self.config.sim_gpu.currentText() or "RTX 4090",
                          self.config.sim_count.value(), list(self.gpu_readings), mid(self.ramp.prompt.text(), 512),
                          mid(self.ramp.output.text(), 128), None, self.vllm_version, self.ramp.plan_ramp(),
                          self.config.sim_rig().spec_acceptance)

    def _replan(self, *_: Any) -> None:
        if self._closed:
            return
        if not self.config.engine_key().planned:
            self.planner.stop()
            self.state.clear_plan("Attached servers are not planned: ramp and /metrics only.")
            return
        self.planner.request(self._plan_inputs)

    def _on_plan_changed(self) -> None:
        """The state's plan changed: the plan panel, the Curves overlay, the form's
        parallel sizes and the controls follow it."""
        if self._closed:
            return
        st = self.state
        p = st.plan
        if p is not None:
            m = p.model
            self.config.set_model_shape(m.heads, m.kv_heads, m.layers)
            self.config.set_option_notes(option_notes(p))
            self.plan_panel.show_plan(p)
            self.curves.set_prediction(p.curve)
            self.ramp.set_plan_users(p.predicted_users_at_slo)
        else:
            if st.plan_error is not None:
                msg, form_error = st.plan_error
                if form_error:
                    self.plan_panel.show_message(f"Form: {msg}", "error")
                else:
                    self.config.set_model_shape(None, None, None)
                    self.config.set_option_notes({})
                    self.plan_panel.show_message(f"No plan: {msg}", "none")
            else:
                self.plan_panel.show_message(st.message or "")
            self.curves.set_prediction(None)
        self._update_controls()

    def apply_fix(self, fix: dict) -> None:
        """Change the form by a planner or diagnosis fix (option values)."""

        try:
            if self.state.config is None:
                raise ValueError(self.state.config_error or "the form is not complete")
            cfg = apply_fix(self.state.config, fix)
        except ValueError as e:
            QMessageBox.warning(self, "Apply fix", f"The fix cannot be applied to this form: {e}")
            return
        if "tensor_parallel_size" in fix or "pipeline_parallel_size" in fix:
            self.config.set_model_shape(None, None, None)  # every size until the new plan says which are valid
        self.state.set_config(cfg)  # the form follows (config_changed)
        self.statusBar().showMessage("Fix applied: " + ", ".join(f"{k}={v}" for k, v in fix.items()), 8000)

    # ------------------------------------------------------------------ controls
    def launch_block_reason(self) -> str | None:
        """Why Launch is disabled now (None: it is enabled)."""
        c = self.controller
        if self.tuning:
            return "a tune is running (Tune tab): stop it first"
        if c.server_running:
            return f"a server is {c.state}: stop it first"
        if self.plan_error and self.plan_error[1]:
            return self.plan_error[0]
        if self.plan is not None and self.plan.verdict == "error":
            f = self.plan.primary
            return f"{f.problem}: {f.message}" if f else "the plan found an error"
        return None

    def _update_controls(self) -> None:
        c = self.controller
        self._show_state(c.state, "")
        reason = self.launch_block_reason()
        self.act_launch.setEnabled(reason is None)
        launches = self.config.engine_key().launches
        self.act_launch.setText("&Launch" if launches else "&Connect")
        self.act_launch.setToolTip(reason or ("Launch the server as configured" if launches else "Attach to the URL"))
        self.act_ramp.setEnabled(c.ready and not c.ramp_running and not self.tuning)
        self.act_ramp.setToolTip("the tune runs its own searches" if self.tuning else
                                 "" if c.ready else "Launch (or attach to) a server first")
        self.act_abort.setEnabled(c.ramp_running)
        # after a failed launch the supervisor ends the server's group itself: nothing to stop
        self.act_stop.setEnabled((c.server_running or c.supervisor is not None) and c.state != "failed"
                                 or self.tuning)
        self.act_stop.setToolTip("Stop the tune and its server" if self.tuning else "Stop the server")
        self.ramp.set_ready(c.ready and not self.tuning, c.ramp_running)
        self.config.setEnabled(not c.server_running and not self.tuning)
        self.tune.set_blocked(self.tune_block_reason())

    def _show_state(self, state: str, reason: str) -> None:
        color = STATE_COLORS.get(state, "#777")
        eng = self.config.engine_key().spec.short
        self.state_label.setText(f"<span style='color:{color}'>●</span> {eng}: <b>{state}</b>")
        self.state_label.setToolTip(reason or state)
        if state in ("starting", "loading") and not self._closed:
            if not self.launch_timer.isActive():
                self.launch_timer.start()
            self._show_launch_progress()
        else:
            self.launch_timer.stop()
            self.launch_label.hide()

    def _refresh_hosts(self) -> None:
        """The Hosts view (the Live tab's redraw timer): the launched rig's hosts from the
        controller, else the selected profile's before a launch; shown for two or more."""
        rows = self.controller.rig_status()
        if not rows and self.current_profile is not None:
            rows = [{"host": h.label(), "role": "", "rank": None, "state": "not launched", "reason": "",
                     "hostname": "", "cards": [], "offset_s": None, "bound_s": None, "rtt_s": None,
                     "drift_ppm": None} for h in self.current_profile.hosts]
        self.hosts_view.set_rows(rows)
        self.hosts_view.setVisible(len(rows) >= 2)

    def _show_launch_progress(self) -> None:
        """The status bar during a launch: the phase the log reached, the seconds so far
        and, after an earlier launch of this configuration, about how long is left."""
        p = self.controller.launch_progress() if hasattr(self, "controller") else None
        if p is None:
            self.launch_label.hide()
            return
        self.launch_label.setText(p.text())
        done = ", ".join(f"{label} at {s:.0f} s" for _, label, s in p.phases) or "no phase in the log yet"
        self.launch_label.setToolTip(f"Phases so far (from the server's log): {done}")
        self.launch_label.show()

    # ------------------------------------------------------------------ launch / stop
    def build_request(self, config=None) -> LaunchTarget:
        """What Launch starts: the state's configuration, or ``config`` (a ServerConfig: the
        Tune tab's recommendation as the tune launched it); raises ValueError naming the
        field while the form does not validate."""
        self._form_changed()
        cfg = self.state.config if config is None else config
        if cfg is None:
            raise ValueError(self.state.config_error or "the form is not complete")
        eng = self.config.engine_key()
        return launch_target(
            eng, cfg, sim_args=self.config.sim_rig(self.sim_time_scale).argv() if eng.simulated else [],
            python=self.settings.vllm_python, attach_url=self.config.attach_url.text().strip(),
            attach_model=self.config.attach_model.text().strip() or None, use_nvml=self.nvml_ok,
            gpu_interval=1.0 / self.settings.gpu_sample_hz, metrics_interval=1.0 / self.settings.metrics_scrape_hz,
            hosts=list(self.current_profile.hosts) if self.current_profile is not None else [],
            ray_address=self.current_profile.ray_address if self.current_profile is not None else None,
            ssh=self.ssh_options)

    def launch(self) -> None:
        self._launch(None)

    def _launch(self, config) -> None:
        reason = self.launch_block_reason()
        if reason:
            self.statusBar().showMessage(f"Cannot launch: {reason}", 8000)
            return
        try:
            req = self.build_request(config)
        except ValueError as e:
            QMessageBox.warning(self, "Launch", str(e))
            return
        req = self.confirm_rig(req) if req.multi_host else self.confirm_exposure(req)
        if req is None:
            return
        self.banner.hide()
        self.log_pane.clear()
        self.dashboard.reset()
        self.results.clear()
        self.curves.set_measured([])
        self.controller.launch(req)
        self.tabs.setCurrentWidget(self.log_pane if req.engine.launches else self.dashboard)
        self._update_controls()

    def confirm_exposure(self, req: LaunchTarget, lead: str = "The server") -> LaunchTarget | None:
        """A host beyond loopback (0.0.0.0, ::, a LAN address) is launched only when the
        user confirms it in a dialog that shows the real addresses and warns when no API
        key is set (issue 15, item 4); returns the request with ``expose`` set, the
        request unchanged for loopback, or None when the user declines. ``lead``: what
        would listen (the dialog's first words)."""
        if not req.engine.launches or exposure_problem(req.config.host) is None:
            return req
        lines = exposure_lines(req.config.host, req.config.port, {**os.environ, **req.config.env})
        ans = QMessageBox.question(
            self, "Launch beyond this machine",
            f"{lead} would listen beyond this machine:\n\n" + "\n\n".join(lines)
            + "\n\nLaunch it reachable from other machines?", QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
        if ans != QMessageBox.Yes:
            self.statusBar().showMessage(f"Not launched: host {req.config.host} not confirmed", 8000)
            return None
        return dataclasses.replace(req, expose=True)

    def confirm_rig(self, req: LaunchTarget) -> LaunchTarget | None:
        """A launch over two or more hosts starts only after the user saw its plan (issue
        21, item 3): each host's role, rank and command, the hosts' findings and, for a
        head that listens beyond its machine, the exposure (its Launch is the confirmation
        :meth:`confirm_exposure` asks for one server). Returns the request (``expose`` set
        when the head listens beyond its machine), or None when cancelled."""
        preview = rig_preview(req.hosts, req.config, req.ray_address)
        dlg = RigPlanDialog(preview, req.engine, self)
        try:
            ok = self._run_dialog(dlg) == QDialog.Accepted and preview.can_launch
        finally:
            dlg.deleteLater()
        if not ok:
            why = preview.error or next((f.message for f in preview.findings if f.level == "error"), None)
            self.statusBar().showMessage(f"Cannot launch over {len(req.hosts)} hosts: {why}" if why else
                                         f"Not launched: the launch plan over {len(req.hosts)} hosts was not "
                                         "confirmed", 15000)
            return None
        return dataclasses.replace(req, expose=True) if preview.exposed else req

    def tune_confirm(self, start: TuneStart) -> TuneStart | None:
        """Before a tune (the Tune tab): its launches bind beyond loopback only once the
        user confirmed it — :meth:`confirm_exposure`'s dialog for the form's host, or over
        the loaded profile's hosts (two or more) for the head's address, where every
        launch's API server listens (each launch's layout is the tuner's, so there is no
        one plan to preview: the rig's launch plan prunes the layouts it refuses).
        Returns ``start`` with ``expose`` set when confirmed, unchanged when nothing
        listens beyond loopback, None when declined."""
        cfg = start.config
        lead = "The server"
        if len(start.hosts) >= 2:
            cfg = cfg.model_copy(update={"host": start.hosts[0].reach})
            lead = (f"The tune launches over {len(start.hosts)} hosts "
                    f"({', '.join(h.label() for h in start.hosts)}); the head's API server")
        req = self.confirm_exposure(launch_target(start.engine, cfg, hosts=start.hosts), lead)
        return None if req is None else dataclasses.replace(start, expose=req.expose)

    def _run_dialog(self, dlg: QDialog) -> int:
        """Run a modal dialog (tests answer it by patching this method)."""
        return dlg.exec()

    def stop(self) -> None:
        if self.tuning:  # the tune stops its own server (and launches no other)
            self.tune.stop_tune()
        else:
            self.controller.stop()
        self._update_controls()

    def fit_to_screen(self, keep_smaller: bool = False) -> None:
        """Size the window to :data:`PREFERRED_SIZE`, at most :data:`SCREEN_SHARE` of the
        available area of its screen (a 1280×800 laptop screen gets a window that ends
        above its panel, status bar in view), centred there. ``keep_smaller``: only shrink
        a restored geometry that does not fit, and bring it back on screen."""
        scr = self.screen() or QGuiApplication.primaryScreen()
        if scr is None or QGuiApplication.platformName() == "offscreen":
            if not keep_smaller:  # no real screen (offscreen: 800×800 of nothing): the preferred size
                self.resize(*PREFERRED_SIZE)
            return
        avail = scr.availableGeometry()
        w = min(PREFERRED_SIZE[0] if not keep_smaller else self.width(), int(avail.width() * SCREEN_SHARE))
        h = min(PREFERRED_SIZE[1] if not keep_smaller else self.height(), int(avail.height() * SCREEN_SHARE))
        frame = self.frameGeometry()
        if keep_smaller and w == self.width() and h == self.height() and avail.contains(frame):
            return
        hint = self.minimumSizeHint()  # the layout's minimum (enforced at show): centred on what it will be
        w, h = max(w, hint.width()), max(h, hint.height())
        self.resize(w, h)
        # the frame (title bar and borders) is known only once the window manager has it: allow for it
        fw, fh = max(0, frame.width() - self.width()), max(0, frame.height() - self.height())
        w, h = w + fw, h + fh
        self.move(avail.x() + max(0, (avail.width() - w) // 2), avail.y() + max(0, (avail.height() - h) // 2))

    def _on_state(self, state: str, reason: str) -> None:
        if self._closed:
            return
        self._show_state(state, reason)
        if state in ("ready", ATTACHED):
            self.first_run.mark("launch")
        if state in ("ready", ATTACHED) and not self.tuning:
            self.tabs.setCurrentWidget(self.dashboard)
            self.left_tabs.setCurrentWidget(self.ramp)
            self.statusBar().showMessage(f"Server ready at {self.controller.url}", 8000)
        verify, c = self._verify_spec, self.controller
        if verify is not None and state == "ready" and not c.ramp_running:
            self._verify_spec = None
            self._start_ramp(verify.model_copy(update={"url": c.url, "model": c.api_model}))
        elif verify is not None and state not in ("starting", "loading", "ready"):
            self._verify_spec = None  # the launch failed or was stopped: no search
        self._update_controls()

    def _on_launch_failed(self, reason: str, diagnosis) -> None:
        if self._closed:
            return
        self.banner.show_failure(reason, diagnosis)
        self.log_pane.pull()  # the lines up to the failure are in the controller's buffer already
        if self.tuning:
            pass  # the tune goes on with the next candidate; its table says why this one failed
        elif diagnosis is not None and diagnosis.evidence:
            self.show_evidence(diagnosis.evidence)
        else:
            self.tabs.setCurrentWidget(self.log_pane)
        self._update_controls()

    def show_evidence(self, evidence: list) -> None:
        """The Log tab, scrolled to the diagnosis's cause line and marking it."""
        self.tabs.setCurrentWidget(self.log_pane)
        if not self.log_pane.show_evidence(evidence):
            self.statusBar().showMessage("The line the diagnosis names is no longer in the Log tab", 8000)

    def _on_leftovers(self, left, req) -> None:
        if self._closed:
            return
        gib = sum(p.gpu_bytes or 0 for p in left) / 2**30
        text = "\n".join(f"{p.pid}  {p.title}  ({(p.gpu_bytes or 0) / 2**30:.1f} GiB GPU)" for p in left[:20])
        ans = QMessageBox.question(
            self, "Leftover vLLM processes",
            f"{len(left)} leftover vLLM process(es) hold {gib:.1f} GiB of GPU memory:\n\n{text}\n\n"
            "End them before launching?", QMessageBox.Yes | QMessageBox.No | QMessageBox.Cancel)
        if ans == QMessageBox.Yes:
            self.controller.end_leftovers_and_launch(left, req)
        elif ans == QMessageBox.No:
            self.controller.launch(req, skip_leftover_check=True)
        self._update_controls()

    def cleanup_leftovers(self) -> None:
        """List every vLLM process with whose it is and offer to end the leftovers (their
        vLLM Dyno is gone); a process not started by vLLM Dyno only when the box is
        ticked; a running session's server never (app.server.procs.end_leftovers)."""
        def show(found):
            endable = [p for p in found if p.kind in ("orphaned", "unmanaged")]
            if not endable:
                extra = "".join(f"\n{p.pid}  {p.title} — {p.describe()}" for p in found[:30])
                QMessageBox.information(self, "Clean up", "No leftover vLLM processes found." + extra)
                return
            text = "\n".join(f"{p.pid}  {p.title} — {p.describe()}" for p in found[:30])
            box = QMessageBox(QMessageBox.Question, "Clean up",
                              f"End the leftovers (their vLLM Dyno is gone)?\n\n{text}",
                              QMessageBox.Yes | QMessageBox.No, self)
            if any(p.kind == "unmanaged" for p in found):
                box.setCheckBox(QCheckBox("Also end the processes not started by vLLM Dyno"))
            if box.exec() == QMessageBox.Yes:
                also = box.checkBox() is not None and box.checkBox().isChecked()
                self.background.append(run_in_background(
                    "cleanup", lambda: end_leftovers(found, include_unmanaged=also),
                    lambda alive: self.statusBar().showMessage(
                        "Ended." if not alive else f"Still alive: {alive}", 8000)))

        self.background.append(run_in_background("find-leftovers", find_leftovers, show))

    def _on_stopped(self, left) -> None:
        if self._closed:
            return
        if left:
            QMessageBox.warning(self, "Stop", f"Processes of the server's group survived the stop: {left}")
        self.statusBar().showMessage("Server stopped" + (f"; left: {left}" if left else ""), 5000)
        self._update_controls()

    # ------------------------------------------------------------------ ramp
    def run_ramp(self) -> None:
        c = self.controller
        if not c.ready or c.ramp_running:
            return
        try:
            spec = self.ramp.build_spec(c.url, c.api_model)
        except ValueError as e:
            QMessageBox.warning(self, "Ramp", str(e))
            return
        self._start_ramp(spec)

    def launch_tuned(self, prof) -> None:
        """The Tune tab's "Launch recommended": the recommendation (a Profile, not saved)
        in the forms, then the window's own Launch of its configuration exactly (the form
        would write e.g. pipeline_parallel_size 1 as unset)."""
        if self.controller.server_running or self.tuning:
            self.statusBar().showMessage("Cannot launch the recommendation: stop the server of this session first",
                                         8000)
            self._verify_spec = None
            return
        profiles.apply_to_form(prof, self.config, self.ramp)
        self._form_changed()
        self._launch(prof.server_config())  # as the tune launched it (the form shows it, its way)
        if not self.controller.server_running:  # refused or not confirmed: no search follows
            self._verify_spec = None

    def verify_tuned(self, prof, spec) -> None:
        """The Tune tab's "Verify (find capacity)": :meth:`launch_tuned`, then, once the
        server is ready, the capacity search ``spec`` (app.tuner.report.verify_ramp)."""
        self._verify_spec = spec
        self.launch_tuned(prof)

    def _start_ramp(self, spec) -> None:
        c = self.controller
        self.results.clear()
        self.curves.set_measured([])
        self.run_bar.setRange(0, 0 if spec.search is not None else len(spec.levels))  # a search: busy
        self.run_bar.setValue(0)
        self.run_bar.show()
        self.run_label.setText("ramp: starting")
        self.ramp.time_scale = c.time_scale
        c.run_ramp(spec, self.settings.safety, self._record_request())
        planned = spec.planned_seconds  # rig s; + about 2 s of pre-flight checks
        self.dashboard.expect_until(c.clock.now() + planned / c.time_scale + 2.0 if planned else None)
        self.tabs.setCurrentWidget(self.dashboard)
        self._update_controls()

    def _record_request(self) -> RecordSpec | None:
        """What the ramp is recorded with: the forms as a profile snapshot and the plan."""
        try:
            prof = self.form_profile(self.profile_name or "GUI run")
        except ValueError as e:
            self.statusBar().showMessage(f"The ramp is not recorded: {e}", 15000)
            return None
        plan = None
        if self.plan is not None and self.config.engine_key().planned:
            try:
                plan = self.plan.as_dict()
            except Exception:
                log.exception("plan.as_dict failed")
        # the run's name says what differs from the loaded profile ("demo · max_num_seqs 64")
        return RecordSpec(profile=prof, plan=plan, name=variant_name(prof.name, self._base_profile, prof))

    def abort_ramp(self) -> None:
        self.controller.abort_ramp()

    def _on_ramp_started(self, spec) -> None:
        self.first_run.mark("ramp")
        self.ramp.time_scale = self.controller.time_scale
        if self.tuning:  # a search of the tune: the Ramp, Results and Curves tabs follow it
            self.results.clear()
            self.curves.set_measured([])
        self.ramp.ramp_started(spec)
        self.dashboard.set_level_unit(spec.mode)

    def _on_level_started(self, ev: dict) -> None:
        spec = self.controller.ramp_spec
        of = "" if spec is None or spec.search is not None else f"/{len(spec.levels)}"  # a search: open-ended
        what = "rate {:g} req/s" if ev.get("mode") == "rate" else "concurrency {:g}"
        self.run_label.setText(f"ramp: level {ev.get('idx', 0) + 1}{of} ({what.format(ev.get('level', 0))})")

    def _on_level_done(self, st) -> None:
        self.ramp.level_done(st)
        self.results.add_step(st)
        self.curves.set_measured(self.results.steps, spec=self.controller.ramp_spec)
        self.run_bar.setValue(len(self.results.steps))

    def _on_ramp_finished(self, res) -> None:
        if self._closed:
            return
        self.dashboard.expect_until(None)
        for st in res.steps:
            if st.idx not in {s.idx for s in self.results.steps}:
                self.results.add_step(st)
        self.results.refresh_energy()
        self.curves.set_measured(self.results.steps, res.knee, spec=self.controller.ramp_spec)
        reason = res.stop_reason or res.error or ""
        self.ramp.ramp_finished(res.status, reason)
        knee = f" · knee at {res.knee.level:g}" if res.knee else ""
        self.run_label.setText(f"ramp: {res.status}{knee}")
        run = f" · recorded as run #{res.run_id}" if getattr(res, "run_id", None) is not None else ""
        self.results.summary.setText(f"<b>Ramp {res.status}</b>: {reason}{knee}{run}")
        v = getattr(res, "verdict", None)
        self.results.set_verdict(v)
        target = self.controller.core.target
        if (v is not None and not self.tuning and v.users is not None and v.mode == "concurrency"
                and not v.indicative and target is not None):
            self.plan_panel.set_measured(target.config, v.slo, v.users, v.users_low, v.users_high)
        self.run_bar.hide()
        if res.status not in ("done", "slo_broken"):
            self.statusBar().showMessage(f"Ramp {res.status}: {reason}", 15000)
        if self.tuning:
            pass  # the Tune tab shows the tune's answer
        elif getattr(res, "verdict", None) is not None:
            self.tabs.setCurrentWidget(self.results)  # the answer first
            self.first_run.mark("verdict")
        elif res.knee or res.steps:
            self.tabs.setCurrentWidget(self.curves)
        self._update_controls()

    def _energy_per_token(self, st) -> float | None:
        """J/token of a level, from the run controller (the one definition)."""
        return self.controller.energy(st).j_per_token

    # ------------------------------------------------------------------ tune
    @property
    def tuning(self) -> bool:
        """A tune runs (Tune tab): it owns the controller until it ends."""
        return self.tune.running

    def tune_block_reason(self) -> str | None:
        """Why a tune cannot start now (None: it can): it launches its own servers."""
        c = self.controller
        if not self.tuning and (c.server_running or c.ramp_running):
            return f"a server of this session is {c.state}: stop it first (the tune launches its own)"
        return None

    def tune_start(self) -> TuneStart:
        """What the Tune tab tunes: the form's engine, flags, simulated rig (with the
        window's time scale), interpreter, ramp and profile; the loaded profile's hosts
        (two or more: every launch goes over them, reached with :attr:`ssh_options`). Raises ValueError naming
        the field while the form does not validate."""
        cfg = self.config.build_config()
        try:
            prof = self.form_profile(self.profile_name or "tuned")
        except ValueError:
            prof = None
        eng = self.config.engine_key()
        rig = self.current_profile if self.current_profile is not None and len(self.current_profile.hosts) >= 2 else None
        sim = self.config.sim_rig(self.sim_time_scale) if eng.simulated else None
        return TuneStart(engine=eng, config=cfg, sim=sim,
                         python=self.settings.vllm_python, ramp=self.ramp.plan_ramp(), profile=prof,
                         hosts=tuple(rig.hosts) if rig is not None else (), ray_address=rig.ray_address if rig else None,
                         ssh=self.ssh_options if rig is not None else None)

    def _on_tune_running(self, on: bool) -> None:
        if self._closed:
            return
        if on:
            self.banner.hide()
            self.log_pane.clear()
            self.dashboard.reset()
            self.results.clear()
        self.run_label.setText("tune: running" if on else "")
        if not on and (self.tune.res or {}).get("recommendation"):
            self.first_run.mark("verdict")  # the tune's result card: a verdict with its flags
        self._update_controls()

    def _on_tune_profile_saved(self, name: str) -> None:
        self._refresh_profile_list(self.profile_name)
        if self.profile_manager._loaded:
            self.profile_manager.refresh(name)
        self.statusBar().showMessage(f"Saved the tune's recommendation as profile {name!r} (Profiles tab)", 8000)

    # ------------------------------------------------------------------ settings
    def open_settings(self) -> None:
        dlg = SettingsDialog(self.settings, self)
        if dlg.exec():
            self.settings = dlg.result_settings()
            try:
                save_settings(self.settings)
            except OSError as e:
                QMessageBox.warning(self, "Settings", f"Cannot save settings: {e}")
            self.ramp.set_safety(self.settings.safety)
            self.compare.set_pricing(self.settings.pricing)

    # ------------------------------------------------------------------ closing
    def save_state(self) -> None:
        qs = self.qsettings
        qs.setValue("geometry", self.saveGeometry())
        qs.setValue("splitter/left_width", self.split_keeper.wanted())  # a user's drag only (SplitKeeper)
        qs.remove("last_profile")  # kept in settings.yaml since settings schema 1
        qs.sync()
        self.settings = self.settings.model_copy(update={"last_profile": self.profile_name or profiles.DEMO_NAME})
        try:
            save_settings(self.settings)
        except OSError as e:
            log.warning("could not save the last profile to the settings: %s", e)

    def shutdown(self) -> list[int]:
        """Stop timers, the ramp, telemetry and the server (blocking); returns leftover pids."""
        self._closed = True
        self.dashboard.stop()
        self.log_pane.stop()
        self.ramp.timer.stop()
        self.ramp.lengths_timer.stop()
        self.launch_timer.stop()
        for d in self.help_dialogs.values():
            d.close()
        self.first_run.settle()
        self.planner.stop()
        self.tune.shutdown()  # before the controller: a tune would launch its next candidate
        self.statusBar().clearMessage()  # its timeout is a QTimer
        left = self.controller.shutdown()
        for t in self.background:
            t.join(0.1)
        with self._store_lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()
        return left

    def closeEvent(self, ev) -> None:
        why = None if self._closed else self.close_question()
        if why is not None:
            # unsaved edits: Save offered beside Close (issue 37); Save then closes unless it was cancelled
            buttons = QMessageBox.Close | QMessageBox.Cancel
            if self.is_modified():
                buttons |= QMessageBox.Save
            ans = self._ask("Close vLLM Dyno", f"Close the window? {why[0].upper() + why[1:]}.", buttons,
                            QMessageBox.Cancel)
            if ans == QMessageBox.Save:
                self.save_profile_dialog()
                if self.is_modified():  # the save was cancelled or failed: stay open
                    ev.ignore()
                    return
            elif ans != QMessageBox.Close:
                ev.ignore()
                return
        self.save_state()
        if self.controller.server_running or self.controller.supervisor is not None or self.tuning:
            self.statusBar().showMessage("Stopping the server…")
            QApplication.processEvents()
        self.shutdown()
        super().closeEvent(ev)


def app_icon() -> QIcon:
    """The app icon in several sizes, read as package data through importlib.resources
    (works from a checkout, an installed wheel and the frozen build)."""


    icon = QIcon()
    icons = resources.files("resources") / "icons"
    for size in (16, 32, 48, 64, 128, 256):
        pm = QPixmap()
        if pm.loadFromData((icons / f"vllm-dyno-{size}.png").read_bytes()):
            icon.addPixmap(pm)
    return icon
