"""The ramp form (closed loop in users or open loop in req/s with burstiness and a
concurrency cap; levels, step, warm-up, request shape or prompts file, SLO) with
**Run ramp / Abort** and progress per level. Builds an :class:`app.loadgen.spec.RampSpec`."""
from __future__ import annotations

import math
from typing import Any, Callable

from pydantic import ValidationError
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QSpinBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.loadgen.capacity import fmt_users, level_mark
from app.loadgen.prompts import dataset_lengths
from app.loadgen.spec import PLAN_GROWTH, CapacitySearch, RampSpec
from app.run.progress import RampProgress
from widgets.fit import FormScrollArea
from widgets.length_histogram import LengthHistogram
from widgets.workload_form import WorkloadRows


def parse_levels(text: str, mode: str = "concurrency") -> dict[str, Any]:
    """``"1,2,4,8"`` → ``{"levels": [1, 2, 4, 8]}``; ``"64"`` → ``{"max_level": 64}`` (1, 2, 4 … 64);
    ``"64,"`` → ``{"levels": [64]}`` (one level). ``mode`` ``rate``: request rates in
    req/s, the same forms (a single rate that is not a whole number is one level:
    ``"2.5"`` → ``{"levels": [2.5]}``). Raises ValueError naming the text."""
    what = ("request rates (req/s) like 0.5,1,2,4 or one maximum like 16" if mode == "rate"
            else "concurrency levels like 1,2,4,8,16 or one maximum like 64")
    parts = [p for p in text.replace(";", ",").replace(" ", ",").split(",") if p]
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"levels {text!r}: write {what}") from None
    if not nums:
        raise ValueError(f"levels: give at least one level: {what}")
    if len(nums) == 1 and nums[0] > 1 and "," not in text and nums[0] == int(nums[0]):
        return {"max_level": int(nums[0])}
    return {"levels": nums}


#: the Traffic choices: (label, RampSpec.mode)
TRAFFIC = (("Closed loop (users)", "concurrency"), ("Open loop (request rate)", "rate"))


#: Find capacity: the request floor of a level and the least time cap, rig seconds
SEARCH_MIN_REQUESTS = 100
SEARCH_MIN_CAP_S = 600.0


class RampPanel(FormScrollArea):
    """``run_requested`` / ``abort_requested`` when the buttons are pressed. It scrolls, as
    the Server form does: its rows (workloads, open loop, a dataset's histograms) must not
    make the window taller than a 720-pixel screen."""

    run_requested = Signal()
    abort_requested = Signal()
    #: the ramp the plan predicts changed (levels, step, warm-up, lengths, SLO)
    shape_changed = Signal()

    def __init__(self, now_fn: Callable[[], float], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.now_fn = now_fn
        body = QWidget()
        self.setWidget(body)
        v = QVBoxLayout(body)
        g = QGroupBox("Ramp")
        f = f0 = QFormLayout(g)
        self.traffic = QComboBox()
        self.traffic.setObjectName("traffic")
        for label, mode in TRAFFIC:
            self.traffic.addItem(label, mode)
        self.traffic.setToolTip("Closed loop: each level keeps N requests in flight (a user sends its next request "
                                "when the last one ends). Open loop: requests arrive at a rate (req/s) whether or "
                                "not the server keeps up, as real traffic does (vllm bench serve --request-rate)")
        f.addRow("Traffic", self.traffic)
        self.levels = QLineEdit("1,2,4,8,16,32,64")
        self.levels_label = QLabel("Levels (users)")
        f.addRow(self.levels_label, self.levels)
        #: the open-loop rows (the request-rate kind's: burstiness, max concurrency), from their declarations
        self.arrivals = WorkloadRows(f, "arrivals", self)
        self.burstiness = self.arrivals.widgets["burstiness"]
        self.burstiness_label = self.arrivals.labels["burstiness"]
        self.max_conc = self.arrivals.widgets["max_concurrency"]
        self.max_conc_label = self.arrivals.labels["max_concurrency"]
        self.find = QCheckBox()
        self.find.setObjectName("findCapacity")
        # checked when a profile with an SLO is loaded (set_from_profile, issue 37: Run ramp answers
        # "users at your SLO" the trustworthy way); a bare form has no SLO to search for
        f.addRow("", self.find)
        #: said under the box when it is off (a wrapped line: the form keeps its width at 1280×800)
        self.find_note = QLabel("Off: an exploratory ramp of fixed levels — its p99 is indicative.")
        self.find_note.setWordWrap(True)
        self.find_note.setObjectName("findNote")
        f.addRow("", self.find_note)
        #: where the search starts: 0 = the plan's predicted users at the SLO (bracketed by 25 %)
        self.start_level = QSpinBox()
        self.start_level.setObjectName("startLevel")
        self.start_level.setRange(0, 100000)
        self.start_level.setSpecialValueText("the plan's prediction")
        self.start_level.setToolTip("The first level the search probes; it then steps up or down by "
                                    f"{PLAN_GROWTH - 1:.0%} until it brackets the SLO's crossing. 0: the Plan's "
                                    "predicted users at the SLO (1 without a plan: doubling from 1)")
        f.addRow("Start level", self.start_level)
        self.requests = QSpinBox()
        self.requests.setObjectName("requestsPerLevel")
        self.requests.setRange(20, 100000)
        self.requests.setValue(SEARCH_MIN_REQUESTS)
        self.requests.setToolTip("Each level is judged on this many requests sent after every user finished one "
                                 "(a p99 from 100 has one request above it); a level stops sooner once its "
                                 "verdict is decided (two requests over a bound, or far inside it)")
        f.addRow("Requests per level", self.requests)
        #: the planner's predicted users at the SLO (the window sets it with each plan): where the search starts
        self.plan_users: float | None = None
        self.step = QDoubleSpinBox()
        self.step.setRange(1, 3600)
        self.step.setValue(20)
        self.step.setSuffix(" s")
        self.step_label = QLabel("Step duration")
        f.addRow(self.step_label, self.step)
        self.warmup = QDoubleSpinBox()
        self.warmup.setRange(0, 600)
        self.warmup.setValue(2)
        self.warmup.setSuffix(" s")
        self.warmup.setToolTip("Excluded from each level's statistics")
        f.addRow("Warm-up", self.warmup)
        #: the request-shape rows of every workload kind (lengths, dataset, shared prefix, multi-turn …),
        #: generated from their declarations (app.loadgen.workload.form_rows)
        self.lengths_view = LengthHistogram()  # under Prompts file
        self.workload = WorkloadRows(f, "requests", self, below={"prompts_file": self.lengths_view})
        self.prompt = self.workload.widgets["prompt_tokens"]
        self.output = self.workload.widgets["output_tokens"]
        self.vary = self.workload.widgets["length_spread"]
        self.prompts_file = self.workload.widgets["prompts_file"]
        self.multi_turn = self.workload.widgets["multi_turn"]
        self.shared_prefix = self.workload.widgets["shared_prefix"]
        #: a profile's dataset options the form has no field for (prompts_format, prompts_column, output_cap)
        self.dataset_extra: dict[str, Any] = {}
        self.lengths_timer = QTimer(self)
        self.lengths_timer.setSingleShot(True)
        self.lengths_timer.setInterval(300)
        self.lengths_timer.timeout.connect(self._dataset_changed)
        self.prompts_file.textChanged.connect(self.lengths_timer.start)
        self.endpoint = QComboBox()
        self.endpoint.addItems(["/v1/completions", "/v1/chat/completions"])
        f.addRow("Endpoint", self.endpoint)
        v.addWidget(g)

        s = QGroupBox("SLO (p99; 0 = none)")
        f = QFormLayout(s)
        self.slo_ttft = QDoubleSpinBox()
        self.slo_ttft.setRange(0, 600000)
        self.slo_ttft.setDecimals(0)
        self.slo_ttft.setSuffix(" ms")
        self.slo_ttft.setValue(0)
        self.slo_tpot = QDoubleSpinBox()
        self.slo_tpot.setRange(0, 60000)
        self.slo_tpot.setDecimals(0)
        self.slo_tpot.setSuffix(" ms")
        self.slo_tpot.setValue(0)
        f.addRow("TTFT p99", self.slo_ttft)
        f.addRow("TPOT p99", self.slo_tpot)
        v.addWidget(s)
        #: why the form does not make a ramp (e.g. multi-turn with request rates), in red; hidden when it does
        self.form_error = QLabel()
        self.form_error.setObjectName("rampFormError")
        self.form_error.setWordWrap(True)
        self.form_error.setStyleSheet("color: #a61b1b")
        self.form_error.hide()
        v.addWidget(self.form_error)
        self.safety_label = QLabel()
        self.safety_label.setWordWrap(True)
        v.addWidget(self.safety_label)

        row = QHBoxLayout()
        self.run_btn = QPushButton("Run ramp")
        self.run_btn.setObjectName("runRamp")
        self.abort_btn = QPushButton("Abort")
        self.abort_btn.setObjectName("abortRamp")
        self.abort_btn.setEnabled(False)
        self.run_btn.clicked.connect(self.run_requested)
        self.abort_btn.clicked.connect(self.abort_requested)
        row.addWidget(self.run_btn)
        row.addWidget(self.abort_btn)
        v.addLayout(row)

        self.level_bar = QProgressBar()
        self.level_bar.setFormat("level: %p%")
        self.total_bar = QProgressBar()
        self.total_bar.setFormat("ramp: %v / %m levels")
        self.progress = QLabel("")
        self.progress.setWordWrap(True)
        v.addWidget(self.level_bar)
        v.addWidget(self.total_bar)
        v.addWidget(self.progress)
        v.addStretch(1)
        self.traffic.currentIndexChanged.connect(self._mode_changed)
        self.find.toggled.connect(self._mode_changed)
        self._form = f0
        self._mode_changed()
        self.levels.textChanged.connect(self.shape_changed)
        for w in (self.step, self.warmup, self.slo_ttft, self.slo_tpot, self.start_level, self.requests):
            w.valueChanged.connect(self.shape_changed)
        self.arrivals.changed.connect(self.shape_changed)
        for w in self.workload.widgets.values():  # every request-shape row but the dataset's (its timer's)
            if w is not self.prompts_file:
                getattr(w, "textChanged", getattr(w, "toggled", None)).connect(self.shape_changed)
        self.shape_changed.connect(self._validate)
        self.level_ev: dict | None = None
        #: the ramp in progress: level k, requests so far / needed, elapsed, ETA, rig time
        self.prog: RampProgress | None = None
        self.time_scale = 1.0  # sim k: the spec is in rig seconds, the clock in wall seconds
        self.levels_list: list[float] = []
        self.done: dict[int, str] = {}
        self.timer = QTimer(self)
        self.timer.setInterval(250)
        self.timer.timeout.connect(self._tick)

    @property
    def mode(self) -> str:
        """The RampSpec mode the form builds: ``concurrency`` or ``rate``."""
        return self.traffic.currentData()

    def set_mode(self, mode: str) -> None:
        self.traffic.setCurrentIndex(max(0, self.traffic.findData(mode)))

    def _mode_changed(self, *_: Any) -> None:
        """Closed loop ↔ open loop: the levels' unit, the open-loop fields, the search's words."""
        rate = self.mode == "rate"
        self.levels_label.setText("Levels (req/s)" if rate else "Levels (users)")
        self.levels.setToolTip("Request rates in req/s (e.g. 0.5,1,2,4), or one maximum R for 1, 2, 4 … R" if rate
                               else "Concurrency levels (requests kept in flight), or one maximum N for 1, 2, 4 … N")
        self.arrivals.set_visible(rate)
        search = self.find.isChecked()
        self._form.setRowVisible(self.start_level, search and not rate)
        self._form.setRowVisible(self.requests, search)
        # a search's level ends on its requests (its time cap: the step, at least SEARCH_MIN_CAP_S)
        self._form.setRowVisible(self.step, not search)
        self._form.setRowVisible(self.find_note, not search and not rate)
        if rate:
            self.find.setText("Find max rate at SLO (search)")
            self.find.setToolTip("Probe 1, 2, 4 … req/s up to the Levels' maximum until the SLO breaks, then bisect "
                                 "to 10 % or 0.1 req/s. Each level is judged on at least 100 requests; the step "
                                 f"duration is its time cap (at least {SEARCH_MIN_CAP_S:g} s). Needs an SLO.")
        else:
            self.find.setText("Users at your SLO (capacity search)")
            self.find.setToolTip("On: probe from the Start level (the Plan's prediction) up or down by "
                                 f"{PLAN_GROWTH - 1:.0%} until the SLO breaks, then bisect to 10 % (whole users) — "
                                 "the number to plan with. Each level is judged on the Requests per level sent after "
                                 "each user finished one; the Levels' maximum bounds it and the time cap (at least "
                                 f"{SEARCH_MIN_CAP_S:g} s) ends a slow level. Needs an SLO.\nOff: the fixed Levels of "
                                 "Step duration each — quick curves, but their p99 comes from a few requests with "
                                 "the start-up burst: indicative only.")
        self.shape_changed.emit()

    def _open_loop(self) -> dict[str, Any]:
        """The open-loop fields of the form (empty in closed loop)."""
        if self.mode != "rate":
            return {}
        return {"mode": "rate", **self.arrivals.values()}

    def _dataset_changed(self) -> None:
        """A prompts file typed or chosen: its length histograms (or why it cannot be
        read) under the field, and the plan re-predicted with its lengths."""
        self.update_lengths()
        self.shape_changed.emit()

    def update_lengths(self) -> None:
        """Show the lengths the form's dataset ramp sends (hidden without a prompts file)."""
        text = self.prompts_file.text().strip()
        if not text:
            self.lengths_view.clear()
            return
        try:
            spec = self.build_spec("http://127.0.0.1:8000", None)
            lengths = dataset_lengths(spec)
        except ValueError as e:
            self.lengths_view.show_error(str(e).replace("Value error, ", ""))
            return
        self.lengths_view.show_lengths(lengths, spec.prompts_name or text)

    def set_safety(self, safety) -> None:
        if safety.enabled:
            self.safety_label.setText(f"Safety on: the ramp stops when a GPU comes within {safety.thermal_margin_c:g} °C"
                                      f" of its slowdown temperature or a level's failure rate passes "
                                      f"{safety.max_failure_rate:.0%} (Settings).")
        else:
            self.safety_label.setText("<span style='color:#a61b1b'>Safety limits are off (Settings).</span>")

    def set_ready(self, server_ready: bool, running: bool, reason: str = "") -> None:
        self.run_btn.setEnabled(server_ready and not running)
        self.run_btn.setToolTip("" if server_ready else (reason or "Launch (or attach to) a server first"))
        self.abort_btn.setEnabled(running)

    def build_spec(self, url: str, model: str | None):
        """The form as a RampSpec (rig seconds). Raises ValueError (pydantic's message
        names the field). The safety limits are applied by the run controller."""


        kw: dict[str, Any] = parse_levels(self.levels.text(), self.mode)
        kw.update(self._open_loop())
        slo = {}
        if self.slo_ttft.value() > 0:
            slo["ttft_p99"] = self.slo_ttft.value() / 1000
        if self.slo_tpot.value() > 0:
            slo["tpot_p99"] = self.slo_tpot.value() / 1000
        if self.find.isChecked():  # the levels' maximum bounds the search
            if not slo:
                raise ValueError("Find capacity needs an SLO to judge levels on: set TTFT p99 and/or TPOT p99")
            top = kw.pop("max_level", None) or max(kw.pop("levels"))
            kw.pop("levels", None)
            top = top if self.mode == "rate" else int(top)
            kw.update(search=self.search(top), requests_per_level=self.requests.value())
        kw.update(url=url, model=model or None, endpoint=self.endpoint.currentText(), step_seconds=self.step.value(),
                  warmup_seconds=self.warmup.value(), slo=slo)
        kw.update(self._workload())
        if "search" in kw:
            kw["step_seconds"] = max(kw["step_seconds"], SEARCH_MIN_CAP_S)
        try:
            return RampSpec(**kw)
        except ValidationError as e:
            raise ValueError("; ".join(f"{'.'.join(map(str, er['loc'])) or 'ramp'}: {er['msg']}"
                                       for er in e.errors())) from None

    def search(self, top: float) -> CapacitySearch:
        """The form's capacity search up to ``top``: from the Start level, else (0) from
        the plan's predicted users at the SLO (:attr:`plan_users`), both bracketed by
        PLAN_GROWTH (CapacitySearch.from_prediction); without either (or in rate mode)
        doubling from 1."""
        start = self.start_level.value() or self.plan_users
        if self.mode == "rate" or not start:
            return CapacitySearch(max_level=top)
        return CapacitySearch.from_prediction(start, max_level=top)

    def set_plan_users(self, users: float | None) -> None:
        """The plan's predicted users at the SLO: where a search from "the plan's
        prediction" starts (shown in the Start level field)."""
        self.plan_users = users if users and users > 0 else None
        self.start_level.setSpecialValueText(f"the plan's: {fmt_users(math.floor(self.plan_users))}"
                                             if self.plan_users else "the plan's prediction")

    def _workload(self) -> dict[str, Any]:
        """The request-shape rows as Workload fields (the workloads as plain dicts), with a
        profile's dataset options the form has no row for; raises ValueError naming the
        field's form."""
        out = self.workload.values()
        if "prompts_file" in out:
            out.update(self.dataset_extra)
        return out

    def _validate(self) -> None:
        """Say under the form why it does not make a ramp (the message :meth:`build_spec`
        raises, which names the field and the fix), or hide the line when it does — the
        plan waits for a valid form, and Run ramp would refuse it."""
        try:
            self.build_spec("http://127.0.0.1:8000", None)
        except ValueError as e:
            self.form_error.setText(str(e).replace("Value error, ", ""))
            self.form_error.show()
            return
        self.form_error.hide()

    def plan_ramp(self) -> RampSpec | None:
        """The ramp the plan predicts (its levels, level shape, lengths and SLO): the form
        as :meth:`build_spec` makes it, None while the form does not validate."""
        try:
            spec = self.build_spec("http://127.0.0.1:8000", None)
        except ValueError:
            return None
        if spec.search is not None:  # the plan's search knows nothing of its own answer: from 1, doubling
            spec = spec.model_copy(update={"search": CapacitySearch(max_level=spec.search.max_level)})
        return spec

    def set_from_profile(self, ramp: dict[str, Any]) -> None:
        self.set_mode(ramp.get("mode") or "concurrency")
        self.arrivals.set_values(ramp)
        if "levels" in ramp:
            self.levels.setText(",".join(f"{x:g}" for x in ramp["levels"]))
        elif "max_level" in ramp:
            self.levels.setText(str(ramp["max_level"]))
        for key, w in (("step_seconds", self.step), ("warmup_seconds", self.warmup)):
            if ramp.get(key) is not None:
                w.setValue(float(ramp[key]))
        search = ramp.get("search")
        slo_set = any((ramp.get("slo") or {}).get(k) for k in ("ttft_p99", "tpot_p99"))
        # a profile's ramp with an SLO is answered by the capacity search unless it lists its levels
        self.find.setChecked(bool(search) or (slo_set and not ramp.get("levels")
                                              and (ramp.get("mode") or "concurrency") == "concurrency"))
        if search and search.get("max_level"):
            self.levels.setText(f"{float(search['max_level']):g}")
        self.start_level.setValue(int(search["start"]) if search and search.get("start", 1) > 1 else 0)
        self.requests.setValue(int(ramp.get("requests_per_level") or SEARCH_MIN_REQUESTS))
        slo = ramp.get("slo") or {}
        self.slo_ttft.setValue((slo.get("ttft_p99") or 0) * 1000)
        self.slo_tpot.setValue((slo.get("tpot_p99") or 0) * 1000)
        ep = ramp.get("endpoint") or "/v1/completions"
        if self.endpoint.findText(ep) < 0:
            self.endpoint.addItem(ep)
        self.endpoint.setCurrentText(ep)
        self.dataset_extra = {k: ramp[k] for k in ("prompts_format", "prompts_column", "output_cap")
                              if ramp.get(k) is not None}
        self.workload.set_values(ramp)

    def to_profile(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(parse_levels(self.levels.text(), self.mode))
        d.update(self._open_loop())
        d.update(step_seconds=self.step.value(), warmup_seconds=self.warmup.value())
        d["slo"] = {k: v for k, v in (("ttft_p99", self.slo_ttft.value() / 1000 or None),
                                      ("tpot_p99", self.slo_tpot.value() / 1000 or None)) if v}
        if self.find.isChecked():
            top = d.pop("max_level", None) or max(d.pop("levels"))
            d.pop("levels", None)
            d.update(search={"max_level": top if self.mode == "rate" else int(top),
                             **({"start": self.start_level.value(), "growth": PLAN_GROWTH}
                                if self.start_level.value() and self.mode != "rate" else {})},
                     requests_per_level=self.requests.value(),
                     step_seconds=max(d["step_seconds"], SEARCH_MIN_CAP_S))
        d["endpoint"] = self.endpoint.currentText()
        d.update({k: list(v) if isinstance(v, tuple) else v for k, v in self._workload().items()})
        return d

    # ------------------------------------------------------------------ progress
    def reset_progress(self) -> None:
        """Forget the last ramp's progress (another profile or engine: a new session)."""
        self.timer.stop()
        self.levels_list, self.done, self.level_ev, self.prog = [], {}, None, None
        if hasattr(self, "spec"):
            del self.spec
        self.level_bar.setValue(0)
        self.total_bar.setRange(0, 1)
        self.total_bar.setValue(0)
        self.progress.setText("")

    def ramp_started(self, spec) -> None:
        self.levels_list = list(spec.levels)
        self.spec = spec
        self.prog = RampProgress(spec, self.time_scale, self.now_fn())
        self.done = {}
        self.level_ev = None
        self.total_bar.setRange(0, math.ceil(self.prog.levels_after()) if spec.search is not None
                                else len(self.levels_list))
        self.total_bar.setValue(0)
        self.level_bar.setValue(0)
        self.timer.start()
        self._render()

    def level_started(self, ev: dict) -> None:
        self.level_ev = ev
        if self.prog is not None:
            self.prog.level_started(ev)
        if ev.get("idx", 0) >= len(self.levels_list):  # a search chooses its levels as it goes
            self.levels_list.append(float(ev.get("level", 0)))
        self._render()

    def records_added(self, records) -> None:
        """Finished requests (the run controller's): the level's requests so far."""
        if self.prog is not None:
            self.prog.add(records)

    def level_done(self, st) -> None:
        if self.prog is not None:
            self.prog.level_done(st)
            if self.spec.search is not None:  # a search: the levels done + those it still expects
                self.total_bar.setRange(0, len(self.done) + 1 + math.ceil(self.prog.levels_after()))
        self.done[st.idx] = level_mark(st)
        self.total_bar.setValue(len(self.done))
        self._render()

    def ramp_finished(self, status: str, reason: str) -> None:
        self.timer.stop()
        self.level_bar.setValue(100 if status in ("done", "slo_broken") else self.level_bar.value())
        self._render(f"<b>Ramp {status}</b>: {reason}")

    def _tick(self) -> None:
        ev = self.level_ev
        if ev is None or not hasattr(self, "spec"):
            return
        need = self.prog.needed if self.prog is not None else None
        span = ((self.spec.warmup_seconds or 0) + (self.spec.step_seconds or 0)) / self.time_scale
        if need and self.prog is not None:  # a level judged on its requests: how many it has
            self.level_bar.setValue(int(min(100, 100 * self.prog.measured()[0] / need)))
        elif span > 0:
            self.level_bar.setValue(int(min(100, 100 * (self.now_fn() - ev.get("t", 0)) / span)))
        self._render()

    def _render(self, tail: str = "") -> None:
        cur = self.level_ev.get("idx") if self.level_ev else None
        marks = []
        for i, lv in enumerate(self.levels_list):
            if i in self.done:
                marks.append(f"{self.done[i]}{lv:g}")
            elif i == cur:
                marks.append(f"<b>▶{lv:g}</b>")
            else:
                marks.append(f"<span style='color:#999'>·{lv:g}</span>")
        text = "Levels: " + " ".join(marks) if marks else ""
        if self.prog is not None:  # in progress: level k, requests, elapsed, ETA, rig time; then what it took
            text += "<br>" + (self.prog.summary(self.now_fn()) if tail else self.prog.text(self.now_fn()))
        if self.prog is not None and getattr(self.spec, "search", None) is None:
            text += ("<br><i>Exploratory ramp: its p99 comes from a few requests a level, start-up burst "
                     "included — indicative only; tick “Users at your SLO” for the number to plan with.</i>")
        if tail:
            text += "<br>" + tail
        self.progress.setText(text)
