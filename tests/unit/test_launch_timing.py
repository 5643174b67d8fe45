"""Launch phases from the server's log and the expected time left (issue 19, item 3).

The lines are vLLM's own wordings (vLLM 0.32.0, files named in
app/server/logparse.py ``LAUNCH_PHASES``; the 0.10/0.11 variants where they differ),
with the process prefix and the ANSI colours 0.10 prints. The timing half runs the
simulated rig through the run controller twice with a real SQLite store: the second
launch of the same configuration knows how long the first took."""
from __future__ import annotations

import sqlite3

import pytest

from app.config import ServerConfig
from app.run.controller import RunListener
from app.run.launch_timing import expected_phases, launch_key, progress
from app.server.logparse import LogParser
from app.store import SCHEMA_VERSION, RunStore

P = "(EngineCore_DP0 pid=4321) INFO 12-02 10:00:00 [{}] "
#: (phase, a line vLLM prints as it enters it) — every wording the phase accepts
WORDINGS = [
    ("engine", P.format("core.py:134") + "Initializing a V1 LLM engine (v0.32.0) with config: model='m', ..."),
    ("weights", P.format("gpu_model_runner.py:5040") + "Starting to load model /models/tiny..."),
    ("weights", P.format("cpu_model_runner.py:68") + "Starting to load model /models/tiny..."),
    ("profile", P.format("gpu_model_runner.py:5150") + "Model loading took 14.96 GiB memory and 9.123456 seconds"),
    ("profile", P.format("gpu_model_runner.py:2") + "Model loading took 14.9570 GiB and 14.706660 seconds"),
    ("profile", P.format("backends.py:1167") + "Dynamo bytecode transform time: 5.01 s"),
    ("profile", P.format("backends.py:399") + "Compiling a graph for compile range (1, 8192) takes 12.30 s"),
    ("profile", P.format("backends.py:296") + "Directly load the compiled graph(s) for compile range (1, 8192) "
                                              "from the cache, took 1.2 s"),
    ("profile", P.format("monitor.py:20") + "torch.compile took 18.40 s in total"),
    ("profile", P.format("monitor.py:34") + "torch.compile takes 18.40 s in total"),  # 0.10
    ("profile", P.format("mem_utils.py:218") + "Memory profiling takes 3.21 seconds. Total non KV cache memory: 1 GiB"),
    ("kv_cache", P.format("gpu_worker.py:760") + "Available KV cache memory: 6.02 GiB"),
    ("kv_cache", P.format("kv_cache_utils.py:1") + "GPU KV cache size: 49,296 tokens"),
    ("kv_cache", P.format("kv_cache_utils.py:1") + "CPU KV cache size: 65,536 tokens"),
    ("graphs", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  10%|#         | 7/67 [00:01<00:09]\r"
               "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  20%|##        | 14/67 [00:02<00:08]"),
    ("graphs", "Capturing CUDA graph shapes: 100%|##########| 67/67 [00:20<00:00,  3.2it/s]"),  # 0.10
    ("profile", P.format("cpu_model_runner.py:87") + "Warming up model for the compilation..."),  # CPU build
    ("api", P.format("core.py:403") + "init engine (profile, create kv cache, warmup model) took 31.20 s"),
    ("api", P.format("core.py:386") + "init engine (profile, create kv cache, warmup model) took 31.20 seconds"),
    ("api", "(APIServer pid=4320) INFO 12-02 10:00:40 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000"),
    ("api", "(APIServer pid=4320) INFO 12-02 10:00:40 [api_server.py:1818] Starting vLLM API server 0 on "
            "http://0.0.0.0:8000"),  # 0.10/0.11
    ("ready", "\x1b[32m(APIServer pid=4320) INFO\x1b[0m:     Application startup complete."),
]


@pytest.mark.parametrize("phase,line", WORDINGS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(WORDINGS)])
def test_every_wording_begins_its_phase(phase, line):
    p = LogParser()
    p.feed("\x1b[1;36m(APIServer pid=4320)\x1b[0m INFO 12-02 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
           0.5)
    assert p.facts.phase is None  # a line of no phase
    p.feed(line, 7.0)
    assert p.facts.phase == phase and p.facts.phase_times == {phase: 7.0}


def test_phases_only_move_forward_and_skipped_ones_are_not_waited_for():
    p = LogParser()
    lines = {ph: ln for ph, ln in reversed(WORDINGS)}  # the first wording of each
    p.feed(lines["engine"], 1.0)
    p.feed(lines["weights"], 2.0)
    p.feed(lines["kv_cache"], 9.0)  # this version prints no compile/profile line
    p.feed(lines["weights"], 10.0)  # a worker repeating an earlier phase's line: no step back
    p.feed(lines["api"], 12.0)
    assert p.facts.phase == "api" and p.facts.phase_times == {"engine": 1.0, "weights": 2.0, "kv_cache": 9.0,
                                                              "api": 12.0}
    p.feed(lines["ready"], 13.0)
    p.feed(lines["engine"], 99.0)  # after ready the phases are over (a restart is a new parser)
    assert p.facts.phase == "ready" and p.facts.ready and "engine" in p.facts.phase_times
    assert p.facts.phase_times["engine"] == 1.0


def test_the_time_left_is_aligned_to_the_phase_the_launch_is_in():
    hist = [{"ready_s": 60.0, "phases": {"engine": 2.0, "weights": 3.0, "profile": 30.0, "ready": 58.0}},
            {"ready_s": 50.0, "phases": {"engine": 2.0, "weights": 3.0, "profile": 20.0, "ready": 48.0}},
            {"ready_s": 70.0, "phases": {"engine": 2.0, "weights": 3.0, "profile": 40.0, "ready": 68.0}}]
    exp = expected_phases(hist)
    assert exp["ready"] == 60.0 and exp["profile"] == 30.0  # medians
    assert expected_phases([]) is None
    # 100 s into the session the launch began; loading weights for 10 s so far
    p = progress("weights", {"engine": 101.0, "weights": 103.0}, 100.0, 113.0, exp)
    assert p.label == "loading weights" and p.elapsed_s == 13.0 and p.phase_elapsed_s == 10.0
    assert p.remaining_s == pytest.approx(60.0 - 3.0 - 10.0) and not p.overdue
    assert "about 47 s left (last launches: 60 s)" in p.text() and p.text().startswith("loading weights · 13 s")
    assert [k for k, _, _ in p.phases] == ["engine", "weights"]
    slow = progress("weights", {"weights": 103.0}, 100.0, 200.0, exp)  # 97 s of loading: longer than ever
    assert slow.overdue and slow.remaining_s == 0.0 and "longer than the last launches (60 s)" in slow.text()
    first = progress("weights", {"weights": 103.0}, 100.0, 113.0, None)  # no earlier launch: no guess
    assert first.remaining_s is None and first.text() == "loading weights · 13 s"
    none_yet = progress(None, {}, 100.0, 101.0, exp)
    assert none_yet.label == "starting the process" and none_yet.remaining_s == pytest.approx(59.0)
    assert progress("ready", {"ready": 158.0}, 100.0, 159.0, exp).remaining_s == 0.0


def test_the_key_is_the_configuration_not_where_it_listens():
    a = ServerConfig(model="m", max_num_seqs=8, port=8000)
    assert launch_key("vllm", a) == launch_key("vllm", a.model_copy(update={"port": 9000, "host": "127.0.0.2"}))
    assert launch_key("vllm", a) != launch_key("vllm", a.model_copy(update={"max_num_seqs": 16}))
    assert launch_key("vllm", a) != launch_key("sim", a)
    assert launch_key("sim", a, ["--sim-gpu-count", "2"]) != launch_key("sim", a, ["--sim-gpu-count", "4"])
    assert launch_key("vllm", a, python="/a/python") != launch_key("vllm", a, python="/b/python")


def test_a_v2_store_gains_the_launches_table(tmp_path):
    path = tmp_path / "runs.sqlite"
    with RunStore(path) as s:
        s.add_launch("k", "sim", 12.5, {"engine": 0.5, "weights": 1.0})
    db = sqlite3.connect(path)  # back to v2: no launches table
    db.execute("DROP TABLE launches")
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    with RunStore(path) as s:
        assert s.migrated_from == 2 and s.launches("k") == []
        for i in range(7):
            s.add_launch("k", "sim", 10.0 + i, {"engine": 0.5})
        rows = s.launches("k", 5)
        assert [r["ready_s"] for r in rows] == [16.0, 15.0, 14.0, 13.0, 12.0] and rows[0]["phases"] == {"engine": 0.5}
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


class Phases(RunListener):
    def __init__(self) -> None:
        self.seen: list = []

    def on_launch_phase(self, p) -> None:
        self.seen.append(p)


RIG = ["--sim-gpu", "RTX 4090", "--sim-gpu-count", "2", "--sim-time-scale", "10", "--sim-seed", "1"]
CFG = ServerConfig(model="Qwen/Qwen2.5-7B-Instruct", served_model_name="q7", tensor_parallel_size=2,
                   max_model_len=4096)


