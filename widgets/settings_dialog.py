"""Settings: the vLLM interpreter (validated by asking it for vLLM's version, off the
GUI thread), the data directory, telemetry rates, the ramp safety limits and the prices. Keys that
loading ``settings.yaml`` dropped (``Settings.load_error``) are listed at the top."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
)

from app.paths import data_dir
from app.server.interpreter import inspect_interpreter, resolve_python
from app.settings import Pricing, SafetyLimits, Settings
from widgets.tasks import run_in_background


class SettingsDialog(QDialog):
    """Edits a copy of ``settings``; :meth:`result_settings` after ``accept``."""

    def __init__(self, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings — vLLM Dyno")
        self.setMinimumWidth(560)
        self._gen = 0
        v = QVBoxLayout(self)
        #: what loading settings.yaml dropped or ignored (empty when the file was fine)
        self.load_problems = QLabel("")
        self.load_problems.setWordWrap(True)
        self.load_problems.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.load_problems.setStyleSheet("color:#a61b1b")
        if settings.load_error:
            self.load_problems.setText("Loading the settings reported (OK saves the values shown below):\n• "
                                       + "\n• ".join(settings.load_error.splitlines()))
        self.load_problems.setVisible(bool(settings.load_error))
        v.addWidget(self.load_problems)
        g = QGroupBox("vLLM")
        f = QFormLayout(g)
        row = QHBoxLayout()
        self.python = QLineEdit(settings.vllm_python or "")
        self.python.setPlaceholderText("automatic (.venv-vllm, then python3)")
        b = QPushButton("…")
        b.setFixedWidth(28)
        b.clicked.connect(self._browse)
        self.check_btn = QPushButton("Check")
        self.check_btn.clicked.connect(self.check_interpreter)
        row.addWidget(self.python, 1)
        row.addWidget(b)
        row.addWidget(self.check_btn)
        f.addRow("Interpreter", row)
        self.python_status = QLabel("")
        self.python_status.setWordWrap(True)
        self.python_status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        f.addRow("", self.python_status)
        v.addWidget(g)

        g = QGroupBox("Data")
        f = QFormLayout(g)
        self.data_dir = QLabel(str(data_dir()))
        self.data_dir.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.data_dir.setToolTip("Profiles, runs.sqlite and settings.yaml live here (gui.ini only keeps the "
                                 "window geometry); set VLLM_DYNO_HOME to move it")
        f.addRow("Data directory", self.data_dir)
        f.addRow("", QLabel("<small>Set the VLLM_DYNO_HOME environment variable to use another directory.</small>"))
        v.addWidget(g)

        g = QGroupBox("Telemetry")
        f = QFormLayout(g)
        self.gpu_hz = QDoubleSpinBox()
        self.gpu_hz.setRange(0.1, 50)
        self.gpu_hz.setSuffix(" Hz")
        self.gpu_hz.setValue(settings.gpu_sample_hz)
        self.metrics_hz = QDoubleSpinBox()
        self.metrics_hz.setRange(0.1, 20)
        self.metrics_hz.setSuffix(" Hz")
        self.metrics_hz.setValue(settings.metrics_scrape_hz)
        f.addRow("GPU sampling", self.gpu_hz)
        f.addRow("/metrics scraping", self.metrics_hz)
        v.addWidget(g)

        g = QGroupBox("Safety limits (ramp)")
        f = QFormLayout(g)
        self.safety_on = QCheckBox("Stop the ramp when a limit is reached")
        self.safety_on.setChecked(settings.safety.enabled)
        self.margin = QDoubleSpinBox()
        self.margin.setRange(0, 30)
        self.margin.setSuffix(" °C below slowdown")
        self.margin.setValue(settings.safety.thermal_margin_c)
        self.fail = QDoubleSpinBox()
        self.fail.setRange(1, 100)
        self.fail.setSuffix(" % failed requests")
        self.fail.setValue(settings.safety.max_failure_rate * 100)
        f.addRow("", self.safety_on)
        f.addRow("GPU temperature", self.margin)
        f.addRow("Failure rate", self.fail)
        v.addWidget(g)

        g = QGroupBox("Prices (cost per million tokens in the verdict and Compare)")
        f = QFormLayout(g)
        pr = settings.pricing
        self.gpu_hour = QDoubleSpinBox()
        self.gpu_hour.setRange(0, 1000)
        self.gpu_hour.setDecimals(3)
        self.gpu_hour.setSpecialValueText("not set")
        self.gpu_hour.setValue(pr.gpu_hour or 0)
        self.gpu_hour.setToolTip("Per card and hour: rental, or what the cards cost spread over their life")
        self.kwh = QDoubleSpinBox()
        self.kwh.setRange(0, 100)
        self.kwh.setDecimals(3)
        self.kwh.setSpecialValueText("not set")
        self.kwh.setValue(pr.kwh or 0)
        self.kwh.setToolTip("Electricity, applied to the measured GPU power")
        self.currency = QLineEdit(pr.currency)
        self.currency.setMaximumWidth(60)
        f.addRow("Per GPU-hour", self.gpu_hour)
        f.addRow("Per kWh", self.kwh)
        f.addRow("Currency", self.currency)
        v.addWidget(g)

        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        v.addWidget(self.buttons)
        self.base = settings

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Python interpreter with vLLM")
        if path:
            self.python.setText(path)
            self.check_interpreter()

    def check_interpreter(self) -> None:
        """Ask the interpreter for its vLLM version (background; ≤ 60 s)."""

        self._gen += 1
        gen = self._gen
        py = self.python.text().strip() or None
        self.python_status.setText("checking…")

        def done(info):
            if gen == self._gen:
                self.python_status.setText(f"<span style='color:#1e7b34'>✓ {info.distribution} {info.version}"
                                           f" ({info.launch_form} form) at {info.python}</span>")

        def err(e):
            if gen == self._gen:
                self.python_status.setText(f"<span style='color:#a61b1b'>✗ {e}</span>")

        self.thread = run_in_background("check-python", lambda: inspect_interpreter(resolve_python(py)), done, err)

    def result_settings(self) -> Settings:
        """The edited settings (keys the dialog does not show, e.g. ``last_profile``, kept);
        ``load_error`` cleared, since saving them writes valid values."""
        return self.base.model_copy(update={
            "load_error": None,
            "vllm_python": self.python.text().strip() or None,
            "gpu_sample_hz": self.gpu_hz.value(), "metrics_scrape_hz": self.metrics_hz.value(),
            "safety": SafetyLimits(enabled=self.safety_on.isChecked(), thermal_margin_c=self.margin.value(),
                                   max_failure_rate=self.fail.value() / 100),
            "pricing": Pricing(gpu_hour=self.gpu_hour.value() or None, kwh=self.kwh.value() or None,
                               currency=self.currency.text().strip() or "$")})
