"""The configuration form: engine, model, GPUs and the ``vllm serve`` options.

Presentation only: it turns widget values into a :class:`app.config.ServerConfig`
(plus engine, sim rig and attach target) and back. Tensor/pipeline-parallel choices are
limited to values valid for the selected cards and the model's heads (from the plan).
"""
from __future__ import annotations

import shlex
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox,
                               QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPlainTextEdit, QPushButton,
                               QScrollArea, QSlider, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.config import DTYPES, ServerConfig

ENGINES = [("vllm", "vLLM"), ("sim", "Simulated rig"), ("attach", "Attach to a URL")]
KV_DTYPES = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
#: used until the installed vLLM's list (or its version's list) is known
FALLBACK_QUANT = ["awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "bitsandbytes", "compressed-tensors", "gguf"]
GIB = 2**30


def _opt_spin(maximum: int, step: int = 1) -> QSpinBox:
    """A spin box whose 0 means "not set" (vLLM's default)."""
    s = QSpinBox()
    s.setRange(0, maximum)
    s.setSingleStep(step)
    s.setSpecialValueText("default")
    s.setAccelerated(True)
    return s


class GpuTable(QTableWidget):
    """The cards NVML reports, with a checkbox each. ``selection_changed`` on toggles."""

    selection_changed = Signal()
    COLS = ["", "GPU", "Memory", "Temp", "Processes"]

    def __init__(self) -> None:
        super().__init__(0, len(self.COLS))
        self.setHorizontalHeaderLabels(self.COLS)
        self.verticalHeader().setVisible(False)
        self.horizontalHeader().setSectionResizeMode(1, QHeaderView.Stretch)
        for c in (0, 2, 3, 4):
            self.horizontalHeader().setSectionResizeMode(c, QHeaderView.ResizeToContents)
        self.setSelectionMode(QTableWidget.NoSelection)
        self.setEditTriggers(QTableWidget.NoEditTriggers)
        self.setMaximumHeight(150)
        self.itemChanged.connect(lambda *_: self.selection_changed.emit())
        self.readings: list[Any] = []
        self.status_text = "detecting GPUs…"
        self._show_message(self.status_text)

    def _show_message(self, text: str) -> None:
        self.blockSignals(True)
        self.setRowCount(1)
        it = QTableWidgetItem(text)
        it.setFlags(Qt.ItemIsEnabled)
        self.setItem(0, 1, it)
        for c in (0, 2, 3, 4):
            self.setItem(0, c, QTableWidgetItem(""))
        self.blockSignals(False)

    def set_readings(self, readings: list[Any], status_text: str) -> None:
        """``readings``: app.telemetry.gpu_source.GpuReading list ([] when no GPU)."""
        self.readings = list(readings)
        self.status_text = status_text
        if not readings:
            self._show_message(status_text)
            return
        self.blockSignals(True)
        self.setRowCount(len(readings))
        for row, r in enumerate(readings):
            chk = QTableWidgetItem()
            chk.setFlags(Qt.ItemIsUserCheckable | Qt.ItemIsEnabled)
            chk.setCheckState(Qt.Checked)
            chk.setData(Qt.UserRole, r.index)
            self.setItem(row, 0, chk)
            self.setItem(row, 1, QTableWidgetItem(f"{r.index}: {r.name or '?'}"))
            mem = "–"
            if r.memory_total_bytes:
                used = (r.memory_used_bytes or 0) / GIB
                mem = f"{used:.1f} / {r.memory_total_bytes / GIB:.1f} GiB"
            self.setItem(row, 2, QTableWidgetItem(mem))
            self.setItem(row, 3, QTableWidgetItem("–" if r.temp_gpu_c is None else f"{r.temp_gpu_c:.0f} °C"))
            procs = r.processes or []
            txt = ", ".join(f"{p.pid} ({(p.used_memory_bytes or 0) / GIB:.1f} GiB)" for p in procs) or "none"
            self.setItem(row, 4, QTableWidgetItem(txt))
        self.blockSignals(False)
        self.selection_changed.emit()

    def selected(self) -> list[int]:
        out = []
        for row in range(self.rowCount()):
            it = self.item(row, 0)
            if it is not None and it.data(Qt.UserRole) is not None and it.checkState() == Qt.Checked:
                out.append(int(it.data(Qt.UserRole)))
        return out

    def select(self, indices: list[int] | None) -> None:
        """Check exactly ``indices`` (None = all)."""
        self.blockSignals(True)
        for row in range(self.rowCount()):
            it = self.item(row, 0)
            if it is None or it.data(Qt.UserRole) is None:
                continue
            on = indices is None or int(it.data(Qt.UserRole)) in indices
            it.setCheckState(Qt.Checked if on else Qt.Unchecked)
        self.blockSignals(False)
        self.selection_changed.emit()


class ConfigPanel(QScrollArea):
    """The server form. ``changed`` fires on every edit (the plan panel debounces it)."""

    changed = Signal()
    profile_selected = Signal(str)
    save_profile_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setObjectName("configPanel")
        self._heads: tuple[int, int, int] | None = None  # heads, kv heads, layers
        self._loading = False
        body = QWidget()
        self.setWidget(body)
        v = QVBoxLayout(body)

        # profile
        row = QHBoxLayout()
        self.profile = QComboBox()
        self.profile.setToolTip("Tuning profile: the form's values, the ramp and the rig")
        self.profile.activated.connect(lambda i: self.profile_selected.emit(self.profile.itemText(i)))
        self.save_btn = QPushButton("Save…")
        self.save_btn.setToolTip("Save the form and the ramp as a profile")
        self.save_btn.clicked.connect(self.save_profile_requested)
        row.addWidget(QLabel("Profile"))
        row.addWidget(self.profile, 1)
        row.addWidget(self.save_btn)
        v.addLayout(row)

        # engine
        eng = QGroupBox("Engine")
        f = QFormLayout(eng)
        self.engine = QComboBox()
        for key, label in ENGINES:
            self.engine.addItem(label, key)
        self.engine.setToolTip("vLLM: launch the real server · Simulated rig: a vLLM-compatible server timed by "
                               "the performance model · Attach: benchmark a server that is already running")
        f.addRow("Engine", self.engine)
        self.sim_gpu = QComboBox()
        self.sim_count = QSpinBox()
        self.sim_count.setRange(1, 16)
        self.sim_count.setSuffix(" GPUs")
        rig = QHBoxLayout()
        rig.addWidget(self.sim_gpu, 1)
        rig.addWidget(QLabel("×"))
        rig.addWidget(self.sim_count)
        self.sim_row = QWidget()
        self.sim_row.setLayout(rig)
        rig.setContentsMargins(0, 0, 0, 0)
        f.addRow("Rig", self.sim_row)
        self.attach_url = QLineEdit("http://127.0.0.1:8000")
        self.attach_model = QLineEdit()
        self.attach_model.setPlaceholderText("served model name (empty: the first /v1/models lists)")
        f.addRow("URL", self.attach_url)
        f.addRow("Served name", self.attach_model)
        self._engine_form = f
        v.addWidget(eng)

        # model
        mg = QGroupBox("Model")
        f = QFormLayout(mg)
        mrow = QHBoxLayout()
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setInsertPolicy(QComboBox.NoInsert)
        self.model.setToolTip("A local model directory, a Hugging Face id, or a catalog entry")
        browse = QPushButton("…")
        browse.setToolTip("Choose a model directory (holding config.json)")
        browse.setFixedWidth(28)
        browse.clicked.connect(self._browse_model)
        mrow.addWidget(self.model, 1)
        mrow.addWidget(browse)
        f.addRow("Model", mrow)
        self.served_name = QLineEdit()
        self.served_name.setPlaceholderText("optional")
        f.addRow("Served name", self.served_name)
        v.addWidget(mg)

        # GPUs
        self.gpu_box = QGroupBox("GPUs")
        gl = QVBoxLayout(self.gpu_box)
        self.gpu_table = GpuTable()
        gl.addWidget(self.gpu_table)
        qrow = QHBoxLayout()
        self.four_btn = QPushButton("4 cards")
        self.eight_btn = QPushButton("8 cards")
        self.all_btn = QPushButton("All")
        self.four_btn.clicked.connect(lambda: self.gpu_table.select(list(range(4))))
        self.eight_btn.clicked.connect(lambda: self.gpu_table.select(list(range(8))))
        self.all_btn.clicked.connect(lambda: self.gpu_table.select(None))
        for b in (self.four_btn, self.eight_btn, self.all_btn):
            qrow.addWidget(b)
        qrow.addStretch(1)
        gl.addLayout(qrow)
        v.addWidget(self.gpu_box)

        # parallelism and batching
        pg = QGroupBox("Parallelism and batching")
        f = QFormLayout(pg)
        self.tp = QComboBox()
        self.pp = QComboBox()
        self.tp.setToolTip("tensor_parallel_size: only values that divide the model's attention heads and fit "
                           "the selected cards are offered")
        self.pp.setToolTip("pipeline_parallel_size: only values that fit the selected cards and the model's layers")
        f.addRow("Tensor parallel", self.tp)
        f.addRow("Pipeline parallel", self.pp)
        self.no_car = QCheckBox("disable custom all-reduce")
        self.no_car.setToolTip("disable_custom_all_reduce: needed on cards without peer-to-peer access")
        f.addRow("", self.no_car)
        self.max_num_seqs = _opt_spin(65536)
        self.max_num_seqs.setToolTip("max_num_seqs: requests the engine runs at once")
        self.max_batched = _opt_spin(1 << 20, 256)
        self.max_batched.setToolTip("max_num_batched_tokens: tokens per scheduler step (chunked prefill)")
        self.max_model_len = _opt_spin(1 << 21, 1024)
        self.max_model_len.setToolTip("max_model_len: the longest request (prompt + output), tokens")
        f.addRow("max_num_seqs", self.max_num_seqs)
        f.addRow("max_num_batched_tokens", self.max_batched)
        f.addRow("max_model_len", self.max_model_len)
        v.addWidget(pg)

        # precision and memory
        qg = QGroupBox("Precision and memory")
        f = QFormLayout(qg)
        self.quant = QComboBox()
        self.set_quantization_methods(FALLBACK_QUANT, "built-in list")
        self.dtype = QComboBox()
        self.dtype.addItems(list(DTYPES))
        self.kv_dtype = QComboBox()
        self.kv_dtype.addItems(KV_DTYPES)
        f.addRow("Quantization", self.quant)
        f.addRow("dtype", self.dtype)
        f.addRow("kv_cache_dtype", self.kv_dtype)
        urow = QHBoxLayout()
        self.util_slider = QSlider(Qt.Horizontal)
        self.util_slider.setRange(10, 100)
        self.util = QDoubleSpinBox()
        self.util.setRange(0.10, 1.00)
        self.util.setSingleStep(0.01)
        self.util.setDecimals(2)
        self.util.setToolTip("gpu_memory_utilization: fraction of each card's TOTAL memory vLLM may use")
        self.util_slider.valueChanged.connect(lambda x: self.util.setValue(x / 100))
        self.util.valueChanged.connect(lambda x: self.util_slider.setValue(round(x * 100)))
        urow.addWidget(self.util_slider, 1)
        urow.addWidget(self.util)
        f.addRow("GPU memory util.", urow)
        self.prefix = QComboBox()
        self.prefix.addItems(["default", "on", "off"])
        self.prefix.setToolTip("enable_prefix_caching")
        f.addRow("Prefix caching", self.prefix)
        self.eager = QCheckBox("enforce eager (no CUDA graphs)")
        f.addRow("", self.eager)
        v.addWidget(qg)

        # extra
        xg = QGroupBox("Extra options and environment")
        f = QFormLayout(xg)
        self.extra = QLineEdit()
        self.extra.setPlaceholderText("--swap-space 4 --seed 1")
        self.env = QPlainTextEdit()
        self.env.setPlaceholderText("NAME=value, one a line (VLLM_API_KEY goes here, never in options)")
        self.env.setFixedHeight(64)
        f.addRow("Options", self.extra)
        f.addRow("Environment", self.env)
        v.addWidget(xg)
        v.addStretch(1)

        for w in (self.engine, self.sim_gpu, self.tp, self.pp, self.quant, self.dtype, self.kv_dtype, self.prefix):
            w.currentIndexChanged.connect(self._edited)
        self.model.currentTextChanged.connect(self._edited)
        for w in (self.sim_count, self.max_num_seqs, self.max_batched, self.max_model_len):
            w.valueChanged.connect(self._edited)
        self.util.valueChanged.connect(self._edited)
        self.eager.toggled.connect(self._edited)
        self.no_car.toggled.connect(self._edited)
        for w in (self.attach_url, self.attach_model, self.served_name, self.extra):
            w.textChanged.connect(self._edited)
        self.env.textChanged.connect(self._edited)
        self.gpu_table.selection_changed.connect(self._cards_changed)
        self.engine.currentIndexChanged.connect(self._engine_changed)
        # the form follows the panel's width: a combo box sized to its longest entry (a
        # profile name, a model id) made the form wider than the panel and clipped it
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        for combo in body.findChildren(QComboBox):
            combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(6)
        self._refill_parallel()
        self._engine_changed()

    # ------------------------------------------------------------------ choices
    def set_catalogs(self, gpu_names: list[str], model_ids: list[str]) -> None:
        self._loading = True
        cur = self.sim_gpu.currentText()
        self.sim_gpu.clear()
        self.sim_gpu.addItems(gpu_names)
        if cur:
            if self.sim_gpu.findText(cur) < 0:
                self.sim_gpu.addItem(cur)
            self.sim_gpu.setCurrentText(cur)
        text = self.model.currentText()
        self.model.clear()
        self.model.addItems(model_ids)
        self.model.setCurrentText(text)
        self.model.lineEdit().setCursorPosition(0)  # a long id shows its start (the organisation)
        self._loading = False

    def set_quantization_methods(self, methods: list[str], source: str) -> None:
        cur = self.quant.currentData() if self.quant.count() else None
        self.quant.blockSignals(True)
        self.quant.clear()
        self.quant.addItem("none / from the checkpoint", None)
        for m in methods:
            self.quant.addItem(m, m)
        self.quant.setToolTip(f"quantization ({source})")
        if cur:
            self._set_combo_data(self.quant, cur)
        self.quant.blockSignals(False)

    def set_model_shape(self, heads: int | None, kv_heads: int | None, layers: int | None) -> None:
        """The model's attention heads, KV heads and layers (None: unknown → all sizes)."""
        new = (heads, kv_heads, layers) if heads else None
        if new != self._heads:
            self._heads = new
            self._refill_parallel()

    def card_count(self) -> int:
        eng = self.engine_key()
        if eng == "sim":
            return self.sim_count.value()
        if eng == "vllm":
            return max(1, len(self.gpu_table.selected())) if self.gpu_table.readings else 1
        return 1

    def valid_tp(self) -> list[int]:
        n = self.card_count()
        pp = self.pp.currentData() or 1
        out = []
        for t in range(1, max(1, n // pp) + 1):
            if self._heads:
                h, kv, _ = self._heads
                kv = kv or h
                if h % t or not (kv % t == 0 or t % kv == 0):
                    continue
            out.append(t)
        return out or [1]

    def valid_pp(self) -> list[int]:
        n = self.card_count()
        tp = self.tp.currentData() or 1
        layers = self._heads[2] if self._heads and self._heads[2] else n
        return [p for p in range(1, max(1, n // tp) + 1) if p <= layers] or [1]

    def _fill(self, combo: QComboBox, values: list[int], want: int) -> None:
        combo.blockSignals(True)
        combo.clear()
        for x in values:
            combo.addItem(str(x), x)
        if want not in values:
            combo.addItem(f"{want} (not valid here)", want)
        self._set_combo_data(combo, want)
        combo.blockSignals(False)

    def _refill_parallel(self) -> None:
        tp = self.tp.currentData() or 1
        pp = self.pp.currentData() or 1
        self._fill(self.pp, self.valid_pp(), pp)
        self._fill(self.tp, self.valid_tp(), tp)
        self._fill(self.pp, self.valid_pp(), pp)

    @staticmethod
    def _set_combo_data(combo: QComboBox, value: Any) -> None:
        i = combo.findData(value)
        if i >= 0:
            combo.setCurrentIndex(i)

    # ------------------------------------------------------------------ events
    def _edited(self, *_: Any) -> None:
        if not self._loading:
            self.changed.emit()

    def _cards_changed(self) -> None:
        self._refill_parallel()
        self._edited()

    def _engine_changed(self, *_: Any) -> None:
        eng = self.engine_key()
        f = self._engine_form
        f.setRowVisible(self.sim_row, eng == "sim")
        f.setRowVisible(self.attach_url, eng == "attach")
        f.setRowVisible(self.attach_model, eng == "attach")
        self.gpu_box.setVisible(eng == "vllm")
        self._refill_parallel()

    def _browse_model(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Model directory (holding config.json)")
        if d:
            self.model.setCurrentText(d)

    # ------------------------------------------------------------------ values
    def engine_key(self) -> str:
        return self.engine.currentData() or "vllm"

    def sim_args(self, time_scale: float = 1.0) -> list[str]:
        out = ["--sim-gpu", self.sim_gpu.currentText() or "RTX 4090", "--sim-gpu-count", str(self.sim_count.value())]
        if time_scale != 1.0:
            out += ["--sim-time-scale", f"{time_scale:g}"]
        return out

    def build_config(self) -> ServerConfig:
        """The form as a ServerConfig. Raises ValueError (pydantic's, naming the field)."""
        model = self.model.currentText().strip()
        if not model:
            raise ValueError("model: give a model directory, a Hugging Face id or a catalog entry")
        env: dict[str, str] = {}
        for n, line in enumerate(self.env.toPlainText().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"environment line {n} {line!r}: write NAME=value")
            k, val = line.split("=", 1)
            env[k.strip()] = val.strip()
        try:
            extra = shlex.split(self.extra.text())
        except ValueError as e:
            raise ValueError(f"extra options: {e}") from e
        tp, pp = self.tp.currentData() or 1, self.pp.currentData() or 1
        pref = {"default": None, "on": True, "off": False}[self.prefix.currentText()]
        kw: dict[str, Any] = dict(
            model=model, served_model_name=self.served_name.text().strip() or None,
            tensor_parallel_size=tp if tp > 1 else None, pipeline_parallel_size=pp if pp > 1 else None,
            max_num_seqs=self.max_num_seqs.value() or None, max_num_batched_tokens=self.max_batched.value() or None,
            max_model_len=self.max_model_len.value() or None, gpu_memory_utilization=round(self.util.value(), 2),
            quantization=self.quant.currentData(), dtype=None if self.dtype.currentText() == "auto" else
            self.dtype.currentText(), kv_cache_dtype=None if self.kv_dtype.currentText() == "auto" else
            self.kv_dtype.currentText(), enable_prefix_caching=pref, enforce_eager=True if self.eager.isChecked()
            else None, disable_custom_all_reduce=True if self.no_car.isChecked() else None,
            env=env, extra_args=extra,
        )
        if self.engine_key() == "vllm" and self.gpu_table.readings:
            kw["gpus"] = self.gpu_table.selected()
        from pydantic import ValidationError

        try:
            return ServerConfig(**kw)
        except ValidationError as e:
            msgs = "; ".join(f"{'.'.join(map(str, er['loc'])) or 'config'}: {er['msg']}" for er in e.errors())
            raise ValueError(msgs) from None

    def set_config(self, cfg: ServerConfig) -> None:
        """Show ``cfg`` in the form (invalid TP/PP values are kept and marked)."""
        self._loading = True
        try:
            self.model.setCurrentText(cfg.model)
            self.model.lineEdit().setCursorPosition(0)  # a long id shows its start (the organisation)
            self.served_name.setText(cfg.served_model_name or "")
            self._fill(self.tp, self.valid_tp(), cfg.tensor_parallel_size or 1)
            self._fill(self.pp, self.valid_pp(), cfg.pipeline_parallel_size or 1)
            self.max_num_seqs.setValue(cfg.max_num_seqs or 0)
            self.max_batched.setValue(cfg.max_num_batched_tokens or 0)
            self.max_model_len.setValue(cfg.max_model_len or 0)
            self.util.setValue(cfg.gpu_memory_utilization or 0.9)
            if cfg.quantization and self.quant.findData(cfg.quantization) < 0:
                self.quant.addItem(cfg.quantization, cfg.quantization)
            self._set_combo_data(self.quant, cfg.quantization)
            self.dtype.setCurrentText(cfg.dtype or "auto")
            self.kv_dtype.setCurrentText(cfg.kv_cache_dtype or "auto")
            self.prefix.setCurrentText({None: "default", True: "on", False: "off"}[cfg.enable_prefix_caching])
            self.eager.setChecked(bool(cfg.enforce_eager))
            self.no_car.setChecked(bool(cfg.disable_custom_all_reduce))
            self.extra.setText(shlex.join(cfg.extra_args))
            self.env.setPlainText("\n".join(f"{k}={v}" for k, v in cfg.env.items()))
            if cfg.gpus is not None and self.gpu_table.readings:
                self.gpu_table.select(cfg.gpus)
        finally:
            self._loading = False
        self.changed.emit()

    def set_engine(self, engine: str, sim_gpu: str | None = None, sim_count: int | None = None,
                   attach_url: str | None = None, attach_model: str | None = None) -> None:
        self._loading = True
        try:
            self._set_combo_data(self.engine, engine)
            if sim_gpu:
                if self.sim_gpu.findText(sim_gpu) < 0:
                    self.sim_gpu.addItem(sim_gpu)
                self.sim_gpu.setCurrentText(sim_gpu)
            if sim_count:
                self.sim_count.setValue(int(sim_count))
            if attach_url:
                self.attach_url.setText(attach_url)
            if attach_model is not None:
                self.attach_model.setText(attach_model)
        finally:
            self._loading = False
        self._engine_changed()
        self.changed.emit()

    def to_profile(self) -> dict[str, Any]:
        """The form as profile fields (``engine``, ``server``, ``env``, ``gpus``, ``sim``,
        ``attach_url``; see widgets.profiles.form_profile). For engine attach the served
        name is kept as the server's ``served-model-name``."""
        cfg = self.build_config()
        server = cfg.to_vllm_config()
        data: dict[str, Any] = {"schema_version": 1, "engine": self.engine_key(), "server": server,
                                "env": dict(cfg.env)}
        if cfg.gpus is not None:
            data["gpus"] = list(cfg.gpus)
        if self.engine_key() == "sim":
            data["sim"] = {"gpu": self.sim_gpu.currentText(), "count": self.sim_count.value()}
        if self.engine_key() == "attach":
            data["attach_url"] = self.attach_url.text().strip()
            if self.attach_model.text().strip():
                server["served-model-name"] = self.attach_model.text().strip()
        return data
