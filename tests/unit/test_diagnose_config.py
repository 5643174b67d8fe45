"""vLLM's configuration refusals (issue 16, item 3).

vLLM's config classes are pydantic dataclasses since 0.10 (``@config @dataclass`` from
``pydantic.dataclasses`` in vllm/config.py @ 0.10.0, vllm/config/*.py @ 0.11.0 and later),
so a ``raise ValueError`` or a failed ``assert`` in their ``__post_init__`` or validators, and
a field outside its ``Field(gt=…, le=…)`` bounds, reach the log as pydantic's
``ValidationError``. The inputs below are pydantic's own text: the 0.32.0 ones were printed
by the CPU build in .venv-vllm (``EngineArgs(...).create_engine_config()`` and
``python -m vllm.entrypoints.openai.api_server --model build/tiny-llama --quantization awq``,
paths shortened); the 0.11.0 and 0.33.0 ones are vLLM's messages at the raise site named
in each comment, formatted by pydantic 2 (a dataclass raising the same message).
"""
from __future__ import annotations

import json

import pytest

from app.cli import main
from app.planner.diagnose import diagnose_text, evidence_text, validation_block

_URL = "    For further information visit https://errors.pydantic.dev/2.14/v/"

# vLLM 0.32.0, `--quantization awq` on an unquantized checkpoint: VllmConfig.__post_init__ →
# _get_quantization_config → get_quant_config (vllm/model_executor/model_loader/weight_utils.py:375
# "Cannot find the config file for {quantization}"); the API server's traceback has no prefix
AWQ_032 = """\
(APIServer pid=23177) INFO 12-01 05:21:09 [api_utils.py:286] non-default args: {'port': 18777, 'model': 'build/tiny-llama', 'quantization': 'awq'}
(APIServer pid=23177) INFO 12-01 05:21:09 [model.py:2152] Using max model len 2048
Traceback (most recent call last):
  File ".venv-vllm/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 2838, in create_engine_config
    config = VllmConfig(
             ^^^^^^^^^^^
  File ".venv-vllm/lib/python3.11/site-packages/pydantic/_internal/_dataclasses.py", line 121, in __init__
    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Cannot find the config file for awq [type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"

# vLLM 0.32.0: ModelConfig (vllm/config/model.py:2645, _get_and_verify_max_len) for max_model_len=100000
MAXLEN_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=2048.0 or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error. [type=value_error, input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"

# vLLM 0.32.0: VllmConfig.__post_init__ → ModelConfig.verify_with_parallel_config (vllm/config/model.py:1547)
TP_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Value error, Total number of attention heads (4) must be divisible by tensor parallel size (3). [type=value_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"

# vLLM 0.32.0: SchedulerConfig (vllm/config/scheduler.py:329) for max_num_batched_tokens=8, max_num_seqs=256
BATCHED_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig
  Value error, max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (256). [type=value_error, input_value=ArgsKwargs((), {'runner_t..., 'stream_interval': 1}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"

# vLLM 0.33.0: ParallelConfig.__post_init__ (vllm/config/parallel.py:1071), a message of three lines
WORLD_033 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig
  Value error, World size (4) is larger than the number of available GPUs (2) in this node. If this is intentional and you are using:
- ray, set '--distributed-executor-backend ray'.
- multiprocessing, set '--nnodes' appropriately. [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]
""" + _URL + "value_error\n"

# gpu_memory_utilization 1.5, two wordings: 0.11.0 checks it in CacheConfig._verify_args (a model_validator,
# vllm/config/cache.py:168 "GPU memory utilization must be less than 1.0. Got …"); 0.32.0/0.33.0 bound the
# field (vllm/config/cache.py: Field(default=0.92, gt=0, le=1)), so pydantic names the field itself.
# 0.11 prefixes every line the API server writes (vllm/utils decorate_logs("APIServer")).
GMU_011 = """\
(APIServer pid=311) pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig
(APIServer pid=311)   Value error, GPU memory utilization must be less than 1.0. Got 1.5. [type=value_error, input_value=ArgsKwargs((), {'gpu_memory_utilization': 1.5}), input_type=ArgsKwargs]
(APIServer pid=311)     For further information visit https://errors.pydantic.dev/2.11/v/value_error
"""
GMU_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig
gpu_memory_utilization
  Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5, input_type=float]
""" + _URL + "less_than_equal\n"

# vLLM 0.32.0: two field errors of ParallelConfig (tensor_parallel_size=0, pipeline_parallel_size=0)
PARALLEL_TWO_032 = """\
pydantic_core._pydantic_core.ValidationError: 2 validation errors for ParallelConfig
pipeline_parallel_size
  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]
""" + _URL + """greater_than_equal
tensor_parallel_size
  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]
""" + _URL + "greater_than_equal\n"

# an `assert` in a validator: pydantic's "Assertion failed, " kind. vLLM 0.32.0 VllmConfig: compile ranges
# (vllm/config/vllm.py:2622 `assert x > 0, f"Invalid compile range endpoint: {x}"`) and the NIXL check
# (vllm/config/vllm.py:1483 "decode_context_parallel_size=… must be 1 or equal to the NIXL transfer parallel size=…")
ASSERT_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Assertion failed, Invalid compile range endpoint: 0 [type=assertion_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
""" + _URL + "assertion_error\n"
NIXL_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
  Assertion failed, decode_context_parallel_size=2 must be 1 or equal to the NIXL transfer parallel size=4. [type=assertion_error, input_value=ArgsKwargs((), {'model_co... 'shutdown_timeout': 0}), input_type=ArgsKwargs]
""" + _URL + "assertion_error\n"

# vLLM 0.11.0: SchedulerConfig._verify_args (vllm/config/scheduler.py:237) when chunked prefill is off,
# raised inside the EngineCore's logger.exception (every line carries the engine's log prefix)
SCHED_011 = """\
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708]   File "/opt/vllm/vllm/config/scheduler.py", line 237, in _verify_args
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708] pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708]   Value error, max_num_batched_tokens (2048) is smaller than max_model_len (4096). This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len. [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]
(EngineCore_DP0 pid=52) ERROR 10-06 08:00:03 [core.py:708]     For further information visit https://errors.pydantic.dev/2.11/v/value_error
(APIServer pid=51) ERROR 10-06 08:00:04 [api_server.py:1900] RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def _value_error_line(text: str) -> str:
    return next(l for l in text.splitlines() if "Value error, " in l or "Assertion failed, " in l
                or "Input should be" in l)


@pytest.mark.parametrize("log, problem, fix", [
    (MAXLEN_032, "max_model_len_exceeds_model", {"max_model_len": 2048}),
    (TP_032, "tp_not_divisor_of_heads", {"tensor_parallel_size": 2}),
    (BATCHED_032, "batched_tokens_below_num_seqs", {"max_num_batched_tokens": 256}),
    (WORLD_033, "not_enough_gpus", {"tensor_parallel_size": 2}),
    (AWQ_032, "quantization_mismatch", {"quantization": None}),
], ids=["ModelConfig-max_model_len", "VllmConfig-tp", "SchedulerConfig-batched", "ParallelConfig-world-3-lines",
        "VllmConfig-awq-unquantized"])
def test_a_known_message_inside_value_error_takes_its_rule(log, problem, fix):
    d = diagnose_text(log)
    assert d.problem == problem and d.fix == fix
    # the cause line first (the Log tab scrolls to it), then the header that names the class
    assert d.evidence[0] == _value_error_line(log)
    assert "validation error for" in d.evidence[1]


@pytest.mark.parametrize("log, cls, said, problem", [
    (GMU_011, "CacheConfig", "GPU memory utilization must be less than 1.0. Got 1.5", "config_out_of_range"),
    (GMU_032, "CacheConfig", "gpu_memory_utilization: Input should be less than or equal to 1", "invalid_config"),
    (ASSERT_032, "VllmConfig", "Invalid compile range endpoint: 0", "config_invalid_value"),
    (NIXL_032, "VllmConfig", "decode_context_parallel_size=2 must be 1 or equal to the NIXL transfer parallel size=4",
     "config_invalid_value"),
], ids=["0.11-CacheConfig-value-error", "0.32-CacheConfig-field", "0.32-assertion",
        "0.32-assertion-nixl"])
def test_an_unknown_config_error_is_shown_in_vllms_words(log, cls, said, problem):
    """A config error no specific rule knows is shown in vLLM's words with its class; its
    kind is the phrase of vLLM's message (diagnose.CONFIG_KINDS: "must be less than" is
    out of range, "Invalid …" an invalid value), or invalid_config for pydantic's own field
    errors."""
    d = diagnose_text(log)
    assert d.problem == problem and d.fix == {}
    assert cls in d.explanation and said in d.explanation
    # vLLM's message only: not pydantic's kind, tail or link
    for noise in ("Value error,", "Assertion failed,", "[type=", "input_value", "errors.pydantic.dev"):
        assert noise not in d.explanation
    # the cause first (a field's error: the field's name, then pydantic's message), the header naming the class last
    lines = log.splitlines()
    at = lines.index(_value_error_line(log))
    field_error = not lines[at - 1].startswith(" ") and "validation error" not in lines[at - 1]
    first = [lines[at - 1], lines[at]] if field_error else [lines[at]]
    assert d.evidence[:len(first)] == first and d.evidence[len(first)].endswith(f"validation error for {cls}")
    assert d.evidence[len(first) + 1:] in ([], [lines[-1]])  # and the wrapper after it, where there is one
    assert "initialization failed" in lines[-1] or d.evidence[len(first) + 1:] == []
    assert not d.after_ready


def test_the_engine_prefixed_scheduler_error_of_0_11_is_a_known_kind_with_its_fix():
    """vLLM 0.11's SchedulerConfig refusal (chunked prefill off, max_num_batched_tokens
    below max_model_len), once shown in vLLM's words only, is now its own kind (issue 36)
    with the fix sized from the log's own numbers."""
    d = diagnose_text(SCHED_011)
    assert d.problem == "batched_tokens_below_max_model_len"
    assert d.fix == {"max_num_batched_tokens": 4096}
    assert "2048" in d.explanation and "4096" in d.explanation


def test_several_errors_are_all_named_in_order():
    d = diagnose_text(PARALLEL_TWO_032)
    assert d.problem == "invalid_config" and "(ParallelConfig, 2 validation errors)" in d.explanation
    assert d.explanation.index("pipeline_parallel_size: Input should be greater than or equal to 1") < \
        d.explanation.index("tensor_parallel_size: Input should be greater than or equal to 1")
    # each field's name and message (the field first: the Log tab scrolls to it), then the header
    said = "  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]"
    assert d.evidence == ["pipeline_parallel_size", said, "tensor_parallel_size", said,
                          "pydantic_core._pydantic_core.ValidationError: 2 validation errors for ParallelConfig"]


def test_the_block_parser_reads_locations_multiline_messages_and_its_extent():
    msgs = PARALLEL_TWO_032.splitlines()
    b = validation_block(msgs, 4)  # the second error's location line
    assert (b.cls, b.header, b.end) == ("ParallelConfig", 0, 6)
    assert [(e.loc, e.message, e.line, e.loc_line) for e in b.errors] == [
        ("pipeline_parallel_size", "Input should be greater than or equal to 1", 2, 1),
        ("tensor_parallel_size", "Input should be greater than or equal to 1", 5, 4)]
    w = WORLD_033.splitlines()
    e, = validation_block(w, 2).errors
    assert e.loc is None and e.loc_line is None and e.line == 1
    assert e.message.endswith("- multiprocessing, set '--nnodes' appropriately.")
    # a line outside any block, and the line after one, belong to none
    assert validation_block(["INFO all good"], 0) is None
    assert validation_block(msgs + ["INFO next"], 7) is None


def test_a_validation_error_of_a_class_that_is_not_a_config_is_not_a_config_refusal():
    # a request model's error (ChatCompletionRequest: vllm/entrypoints/openai/protocol.py @ 0.11.0,
    # …/openai/chat_completion/protocol.py @ 0.32.0) is not a launch problem
    log = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ChatCompletionRequest\n"
           "messages\n  Field required [type=missing, input_value={'model': 'm'}, input_type=dict]\n" + _URL + "missing\n")
    assert diagnose_text(log) is None


# vLLM 0.32.0: ModelConfig for a model path that does not exist (vllm/transformers_utils/config.py:849, a message of
# six lines, its tail on a line of its own); printed with HF_HUB_OFFLINE=1
MISSING_032 = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, Invalid repository ID or local directory specified: '/models/does-not-exist'.
Please verify the following requirements:
1. Provide a valid Hugging Face repository ID.
2. Specify a local directory that contains a recognized configuration file.
   - For Hugging Face models: ensure the presence of a 'config.json'.
   - For Mistral models: ensure the presence of a 'params.json'.
 [type=value_error, input_value=ArgsKwargs((), {'model': .../does-not-exist'}), input_type=ArgsKwargs]
""" + _URL + "value_error\n"


def test_a_message_of_several_lines_with_its_tail_alone():
    d = diagnose_text(MISSING_032)
    assert d.problem == "model_not_found"
    assert d.evidence[0].startswith("  Value error, Invalid repository ID") and "ModelConfig" in d.evidence[1]
    e, = validation_block(MISSING_032.splitlines(), 1).errors
    assert e.message.startswith("Invalid repository ID") and e.message.endswith("'params.json'.")


def test_evidence_text_drops_the_pydantic_tail_only():
    line = _value_error_line(AWQ_032)
    assert evidence_text(line) == "  Value error, Cannot find the config file for awq"
    plain = "(APIServer pid=1) ERROR 01-01 10:00:00 [x.py:1] RuntimeError: boom"
    assert evidence_text(plain) == plain


def test_cli_diagnose_shows_the_cause(tmp_path, capsys):
    log = tmp_path / "vllm.log"
    log.write_text(NIXL_032)
    assert main(["diagnose", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # "must be 1 or equal to": a value vLLM does not take (diagnose.CONFIG_KINDS), the class named
    assert out["problem"] == "config_invalid_value" and out["fix"] == {} and out["after_ready"] is False
    assert "VllmConfig" in out["explanation"]
    assert "decode_context_parallel_size=2 must be 1 or equal to the NIXL transfer parallel size=4" in out["explanation"]
    assert out["evidence"][0] == _value_error_line(NIXL_032)
