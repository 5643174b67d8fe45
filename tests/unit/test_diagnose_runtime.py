"""The engine dies after the server said ready (issue 16, item 9): the diagnosis says so
(``after_ready``), names the failing request's cause and what to change.

vLLM's wordings for a death while serving, by version (the engine's traceback, then the
API server's news):

- ``EngineCore encountered a fatal error.`` + traceback — vllm/v1/engine/core.py
  (0.10.0 :634, 0.11.0 :710, 0.32.0 :1512, 0.33.0 :1586), per line with the engine's prefix;
- a worker's ``WorkerProc hit an exception.`` + traceback — vllm/v1/executor/multiproc_executor.py
  (0.11.0 :671, 0.33.0 :1189), and the engine's ``RuntimeError: Worker failed with error '…',
  please check the stack trace above for the root cause`` (0.11.0 :249, 0.33.0 :526);
- ``AsyncLLM output_handler failed.`` + ``vllm.v1.engine.exceptions.EngineDeadError: EngineCore
  encountered an issue. See stack trace (above) for the root cause.`` — vllm/v1/engine/async_llm.py
  (0.11.0 :480, 0.32.0 :906) and exceptions.py (the same message 0.10.0–0.33.0);
- the client's monitor: ``Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.``
  (core_client.py 0.10.2/0.11.0 :564) or ``[shutdown] MPClient: engine core exited unexpectedly;
  starting cleanup`` (0.32.0 :816, 0.33.0 :840).

The first log was printed by the CPU build (0.32.0) in .venv-vllm serving the tiny model with
head_dim 16 (build/tiny-llama's config with 16 heads of 16): ready after 73 s, ``/health`` 200,
then one ``POST /v1/completions``; ``/health`` answered 503, and the server exited with code 0
(paths shortened, the interpreter's leak warnings at exit left out).
"""
from __future__ import annotations

import pytest

from app.planner.diagnose import diagnose, diagnose_text

CPU_HEAD_DIM_032 = """\
(APIServer pid=28431) INFO 12-01 05:23:59 [api_utils.py:286] non-default args: {'port': 18791, 'model': '/models/tiny-head16', 'served_model_name': ['tiny'], 'distributed_executor_backend': 'uni', 'max_num_seqs': 8}
(EngineCore pid=28783) INFO 12-01 05:24:55 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x
(EngineCore pid=28783) INFO 12-01 05:24:57 [core.py:402] init engine (profile, create kv cache, warmup model) took 40.49 s
(APIServer pid=28431) INFO 12-01 05:24:58 [entry.py:140] Starting vLLM server on http://0.0.0.0:18791
INFO:     Application startup complete.
INFO:     127.0.0.1:48660 - "GET /health HTTP/1.1" 200 OK
INFO:     127.0.0.1:48664 - "GET /health HTTP/1.1" 200 OK
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1496, in run_engine_core
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     engine_core.run_busy_loop()
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/fault_tolerance/engine_core_sentinel.py", line 178, in run_with_fault_tolerance
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     busy_loop_func(self)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1555, in run_busy_loop
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     self._process_engine_step()
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 1606, in _process_engine_step
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     outputs, model_executed = self.step_fn()
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]                               ^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/core.py", line 668, in step
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     future = self.model_executor.execute_model(scheduler_output, non_block=True)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/executor/uniproc_executor.py", line 131, in execute_model
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     output.result()
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File "/usr/lib/python3.11/concurrent/futures/_base.py", line 449, in result
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return self.__get_result()
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File "/usr/lib/python3.11/concurrent/futures/_base.py", line 401, in __get_result
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     raise self._exception
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/executor/uniproc_executor.py", line 109, in collective_rpc
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     result = run_method(self.driver_worker, method, args, kwargs)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/serial_utils.py", line 508, in run_method
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return func(*args, **kwargs)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/worker_base.py", line 370, in execute_model
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return self.worker.execute_model(scheduler_output)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/torch/utils/_contextlib.py", line 124, in decorate_context
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return func(*args, **kwargs)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/gpu_worker.py", line 1328, in execute_model
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     output = self.model_runner.execute_model(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/torch/utils/_contextlib.py", line 124, in decorate_context
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return func(*args, **kwargs)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/gpu_model_runner.py", line 4142, in execute_model
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     self._build_attention_metadata(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2562, in _build_attention_metadata
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     _build_attn_group_metadata(kv_cache_gid, attn_gid, cm)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2496, in _build_attn_group_metadata
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     attn_metadata_i = attn_group.build_metadata(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]                       ^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/worker/utils.py", line 348, in build_metadata
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return self.get_metadata_builder(ubatch_idx).build(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/attention/backends/cpu_attn.py", line 253, in build
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]                          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/vllm/_custom_ops.py", line 3865, in cpu_attn_get_scheduler_metadata
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     scheduler_metadata = torch.ops._C.get_scheduler_metadata(
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]                          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]   File ".venv-vllm/lib/python3.11/site-packages/torch/_ops.py", line 1279, in __call__
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]     return self._op(*args, **kwargs)
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512]            ^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=28783) ERROR 12-01 05:25:00 [core.py:1512] RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/async_llm.py", line 849, in output_handler
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906]     outputs = await engine_core.get_output_async()
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906]               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906]   File ".venv-vllm/lib/python3.11/site-packages/vllm/v1/engine/core_client.py", line 1235, in get_output_async
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906]     raise self._format_exception(outputs) from None
(APIServer pid=28431) ERROR 12-01 05:25:00 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
INFO:     127.0.0.1:48674 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
INFO:     127.0.0.1:48678 - "GET /health HTTP/1.1" 503 Service Unavailable
INFO:     Shutting down
INFO:     Waiting for application shutdown.
INFO:     Application shutdown complete.
INFO:     Finished server process [28431]
(APIServer pid=28431) INFO 12-01 05:25:00 [core_client.py:770] [shutdown] MPClient: start timeout=0s
(APIServer pid=28431) INFO 12-01 05:25:00 [core_client.py:772] [shutdown] MPClient: stopping engine manager
(APIServer pid=28431) INFO 12-01 05:25:00 [utils.py:628] [shutdown] Process manager: send sigterm to process EngineCore
(APIServer pid=28431) WARNING 12-01 05:25:00 [utils.py:648] [shutdown] Process manager: force killing remaining processes count=1
(APIServer pid=28431) WARNING 12-01 05:25:00 [utils.py:653] [shutdown] Process manager: force killing remaining process EngineCore pid 28783
(APIServer pid=28431) INFO 12-01 05:25:00 [core_client.py:774] [shutdown] MPClient: engine manager stopped
(APIServer pid=28431) INFO 12-01 05:25:00 [core_client.py:775] [shutdown] MPClient: cleaning up background resources
(APIServer pid=28431) INFO 12-01 05:25:00 [core_client.py:777] [shutdown] MPClient: complete
"""

# vLLM 0.11.0, TP=2 on GPUs: a CUDA error in a worker's forward pass. The worker logs it
# (multiproc_executor.py:671, process "Worker_TP0", decorate_logs), the engine turns it into
# "Worker failed with error …" (multiproc_executor.py:249) and dies (core.py:710), the API server
# fails its output handler (async_llm.py:480) and its monitor sees the engine gone (core_client.py:564).
# The CUDA text is torch's (c10/cuda/CUDAException.cpp).
CUDA_TP_011 = """\
(APIServer pid=4100) INFO 10-06 09:12:40 [api_server.py:1918] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=4100) INFO:     Application startup complete.
(APIServer pid=4100) INFO:     127.0.0.1:51172 - "GET /health HTTP/1.1" 200 OK
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] WorkerProc hit an exception.
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] Traceback (most recent call last):
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671]   File "/opt/vllm/vllm/v1/executor/multiproc_executor.py", line 666, in worker_busy_loop
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671]     output = func(*args, **kwargs)
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671]   File "/opt/vllm/vllm/v1/worker/gpu_model_runner.py", line 2254, in execute_model
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671]     model_output = self.model(
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710] EngineCore encountered a fatal error.
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] RuntimeError: CUDA error: an illegal memory access was encountered
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] For debugging consider passing CUDA_LAUNCH_BLOCKING=1
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710] Traceback (most recent call last):
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710]   File "/opt/vllm/vllm/v1/engine/core.py", line 701, in run_engine_core
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710]     engine_core.run_busy_loop()
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710]   File "/opt/vllm/vllm/v1/executor/multiproc_executor.py", line 249, in get_response
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710]     raise RuntimeError(
(EngineCore_DP0 pid=4180) ERROR 10-06 09:13:05 [core.py:710] RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered', please check the stack trace above for the root cause
(APIServer pid=4100) ERROR 10-06 09:13:05 [async_llm.py:480] AsyncLLM output_handler failed.
(APIServer pid=4100) ERROR 10-06 09:13:05 [async_llm.py:480] Traceback (most recent call last):
(APIServer pid=4100) ERROR 10-06 09:13:05 [async_llm.py:480]   File "/opt/vllm/vllm/v1/engine/async_llm.py", line 439, in output_handler
(APIServer pid=4100) ERROR 10-06 09:13:05 [async_llm.py:480] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=4100) ERROR 10-06 09:13:06 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.
(APIServer pid=4100) INFO:     Shutting down
"""

# vLLM 0.33.0: the GPU runs out of memory in a forward pass of a large batch after ready
# (core.py:1586; the client's monitor core_client.py:840)
OOM_033 = """\
(APIServer pid=77) INFO 02-10 14:00:01 [api_utils.py:286] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.95, 'max_num_seqs': 512}
INFO:     Application startup complete.
(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1586] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1586] Traceback (most recent call last):
(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1586]   File "/opt/vllm/vllm/v1/worker/gpu_model_runner.py", line 4301, in execute_model
(EngineCore_DP0 pid=91) ERROR 02-10 14:03:10 [core.py:1586] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 23.53 GiB of which 1.02 GiB is free.
(APIServer pid=77) ERROR 02-10 14:03:10 [async_llm.py:943] AsyncLLM output_handler failed.
(APIServer pid=77) ERROR 02-10 14:03:10 [async_llm.py:943] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
(APIServer pid=77) WARNING 02-10 14:03:10 [core_client.py:840] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup
"""

# vLLM 0.11.0: the engine killed from outside (the kernel's OOM killer, SIGKILL): no traceback,
# only the client's monitor (core_client.py:564)
KILLED_011 = """\
(APIServer pid=4100) INFO:     Application startup complete.
(APIServer pid=4100) INFO 10-06 09:20:00 [loggers.py:127] Engine 000: Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 8 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 0.0%
(APIServer pid=4100) ERROR 10-06 09:20:04 [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.
"""


def test_a_known_cause_after_ready_keeps_its_rule_and_says_the_server_is_gone():
    d = diagnose_text(CPU_HEAD_DIM_032)
    assert d.problem == "attention_unsupported" and d.after_ready
    assert d.explanation.startswith("the server was ready, then the engine died on a request")
    assert "cannot serve any more" in d.explanation and "head_dim=16" in d.explanation
    assert d.evidence[0].endswith("RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 "
                                  "kv_cache_idx=0")
    assert d.evidence[1].endswith("EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
                                  "the root cause.")


def test_an_out_of_memory_after_ready_offers_the_rules_fix():
    d = diagnose_text(OOM_033)
    assert d.problem == "cuda_oom" and d.after_ready
    # 0.95 in force (non-default args) less the allocation's shortfall: (1.96 − 1.02) / 23.53 GiB → 0.04, + 0.01
    assert d.fix == {"gpu_memory_utilization": 0.9}
    assert "torch.OutOfMemoryError" in d.evidence[0] and "launch again with the fix" in d.explanation


def test_an_unknown_runtime_error_is_the_first_exception_of_the_engines_traceback():
    d = diagnose_text(CUDA_TP_011)
    assert d.problem == "engine_runtime_error" and d.after_ready and d.fix == {}
    # the worker's own error, not the engine's "Worker failed with error …" nor the EngineDeadError
    assert d.evidence[0] == ("(Worker_TP0 pid=4250) ERROR 10-06 09:13:05 [multiproc_executor.py:671] RuntimeError: "
                             "CUDA error: an illegal memory access was encountered")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in d.explanation
    assert "CUDA_LAUNCH_BLOCKING=1" in d.explanation and "--enforce-eager" in d.explanation
    assert "EngineDeadError" in d.evidence[1]


def test_a_death_with_no_cause_in_the_log_is_still_a_death_after_ready():
    d = diagnose_text(KILLED_011)
    assert d.problem == "engine_dead" and d.after_ready
    assert "the server was ready, then its engine died" in d.explanation
    assert d.evidence == [KILLED_011.splitlines()[2]]


def test_the_supervisors_word_counts_when_the_ready_line_left_the_tail():
    tail = CUDA_TP_011.splitlines()[3:]  # "Application startup complete." is no longer in the last lines
    assert diagnose(tail).after_ready is False  # read from the log alone: not known to be after ready
    d = diagnose(tail, after_ready=True)
    assert d.problem == "engine_runtime_error" and d.after_ready
    # a supervisor that saw the server exit after ready, with nothing in the log: still a diagnosis
    d = diagnose(["INFO:     Application startup complete."], after_ready=True)
    assert d is not None and d.problem == "engine_dead" and d.after_ready and d.evidence == []


def test_lines_before_ready_are_not_the_cause_of_a_death_after_it():
    # a startup warning that a rule would know (vLLM 0.32 logs the port's owner when uvicorn cannot bind
    # at once, launcher.py) is history once the server is ready
    log = ("(APIServer pid=1) WARNING 01-01 10:00:00 [launcher.py:290] port 8000 is used by process … "
           "(Address already in use)\n" + KILLED_011)
    d = diagnose_text(log)
    assert d.problem == "engine_dead" and d.after_ready


def test_a_clean_stop_after_ready_is_no_problem():
    stop = [l for l in CPU_HEAD_DIM_032.splitlines() if "ERROR" not in l and " 500 " not in l and " 503 " not in l]
    assert diagnose(stop) is None


def test_a_startup_failure_names_the_engines_first_exception_when_no_rule_knows_it():
    # vLLM 0.32.0: EngineCore failed to start (core.py:1510) with an error no rule knows, then the wrapper
    log = """\
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:1510] EngineCore failed to start.
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:1510] Traceback (most recent call last):
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:1510]   File "/opt/vllm/vllm/v1/engine/core.py", line 1480, in run_engine_core
(EngineCore_DP0 pid=51) ERROR 01-01 10:00:09 [core.py:1510] KeyError: 'model.layers.0.mlp.experts.w13_weight'
(APIServer pid=50) ERROR 01-01 10:00:10 [api_server.py:10] RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
    d = diagnose_text(log)
    assert d.problem == "engine_init_failed" and not d.after_ready
    assert "KeyError: 'model.layers.0.mlp.experts.w13_weight'" in d.explanation
    assert d.evidence[0].endswith("KeyError: 'model.layers.0.mlp.experts.w13_weight'")
    assert "initialization failed" in d.evidence[1]


@pytest.mark.parametrize("line", [
    "(APIServer pid=4100) ERROR 10-06 09:20:04 [core_client.py:564] Engine core proc EngineCore_DP0 died "
    "unexpectedly, shutting down client.",
    "(APIServer pid=77) WARNING 02-10 14:03:10 [core_client.py:840] [shutdown] MPClient: engine core exited "
    "unexpectedly; starting cleanup",
    "(APIServer pid=77) ERROR 02-10 14:03:10 [utils.py:599] RuntimeError: Engine core process EngineCore_DP0 died "
    "unexpectedly.",
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
    "root cause.",
], ids=["0.11-monitor", "0.32-monitor", "0.32-api-servers", "EngineDeadError"])
def test_every_wording_of_the_death_is_a_death(line):
    d = diagnose(["INFO:     Application startup complete.", line])
    assert d.problem == "engine_dead" and d.after_ready
    # and before ready (a log with no ready line) it is the wrapper it always was
    assert diagnose([line]).problem == "engine_dead" and not diagnose([line]).after_ready
