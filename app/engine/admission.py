"""vLLM's admission control: the API server refuses a request with HTTP 503 when its
queue limits are reached (vLLM 0.29+; the rule of 0.32.0, cited per line).

``--max-num-queued-reqs`` Q and ``--max-num-queued-tokens`` T (vllm/config/scheduler.py:92,
:105) are checked by ``AsyncLLM.check_admission`` (vllm/v1/engine/async_llm.py:316–374)
before the request is rendered and tokenized (``_preflight``,
vllm/entrypoints/generate/base/serving.py:169–181, called from the chat and completions
handlers before ``render``):

- Q: the unfinished requests the API server has handed to the engine (waiting + running,
  across every data parallel rank it routes to; ``OutputProcessor.request_states``,
  vllm/v1/engine/output_processor.py:526, summed over API servers by
  ``SharedAdmissionStats``, vllm/v1/engine/admission_control.py) — refused when
  ``current + n > Q`` (a request with ``n`` choices counts ``n``; :343–360);
- T: the prompt tokens of the requests still in prefill — every request that has not yet
  produced a token counts its whole prompt, chunked progress and prefix-cache hits not
  subtracted (``get_num_queued_tokens``, output_processor.py:532–541) — refused when
  ``current >= T`` (the new request's own prompt is not added; async_llm.py:362–374).

vLLM checks again when it registers the request, after tokenization (``_add_request``,
async_llm.py:564–572: "Register locally before the first await so concurrent tasks see
this request"); a streaming request that fails there has already begun its response and
gets the refusal as its stream's error event (code 503). Q is checked first. The refusal is a ``QueueOverflowError`` or ``MaxQueuedTokensError``
(vllm/exceptions.py:156–183, :class:`GracefulHTTPError`), answered by the API server's
exception handler as JSON ``{"error": {"message", "type": "Service Unavailable", "param":
null, "code": 503}}`` with status 503 (``create_error_response``,
vllm/entrypoints/serve/exception_handling/error_response.py:37–40: the type is the
status's phrase) and no ``Retry-After`` header (none is set anywhere in 0.32.0's
entrypoints). Each refusal adds 1 to the counter ``vllm:admission_rejections_total``
(labels ``model_name``, ``reason`` ∈ :data:`ADMISSION_REASONS`; no ``engine`` label:
vllm/v1/metrics/loggers.py:47, :845–858). A refused request never reaches the engine.

``--max-num-active-seqs`` (vLLM 0.31+; vllm/config/scheduler.py:69) is not a refusal: it
caps the requests the scheduler admits into RUNNING below ``max_num_seqs``
(vllm/v1/core/sched/scheduler.py:132–136, :923) — :class:`app.engine.scheduler.Scheduler`'s
``max_num_active_seqs``.

The HTTP status, 503, is the load generator's ``app.loadgen.records.REJECTED_STATUS`` (the
layer that reads it; the engine speaks no HTTP). The sim's server (app/sim/http_api.py) and the planner's offline levels
(:func:`app.engine.offline.run_level`) both judge a request with :meth:`AdmissionLimits.refusal`.
"""
from __future__ import annotations

from dataclasses import dataclass

#: the ``reason`` label values of ``vllm:admission_rejections`` (vllm/v1/metrics/loggers.py:47 @ 0.32.0)
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
#: the counter's name as exported (prometheus_client adds ``_total``; vllm/v1/metrics/loggers.py:847)
ADMISSION_REJECTIONS_METRIC = "vllm:admission_rejections"
#: the error ``type`` of a refusal's body: ``HTTPStatus(503).phrase`` (error_response.py:38)
REJECTED_TYPE = "Service Unavailable"
#: the messages, by reason (vllm/exceptions.py:164–167 QueueOverflowError, :179–182 MaxQueuedTokensError)
REJECTED_MESSAGES = {
    "max_num_queued_reqs": "The engine is currently busy and cannot accept new requests. "
                           "Please try again later or on a different instance.",
    "max_num_queued_tokens": "The engine has reached its prefill token backlog limit. "
                             "Please try again later or on a different instance.",
}


@dataclass(frozen=True)
class AdmissionLimits:
    """The API server's queue limits: ``max_num_queued_reqs`` (requests in flight, across
    the data parallel ranks) and ``max_num_queued_tokens`` (prompt tokens of requests not
    yet past their prefill); None: no limit (vLLM's default)."""

    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    @property
    def active(self) -> bool:
        return self.max_num_queued_reqs is not None or self.max_num_queued_tokens is not None

    def refusal(self, in_flight: int, prefill_tokens: int, n: int = 1) -> str | None:
        """The reason (one of :data:`ADMISSION_REASONS`) a request of ``n`` choices is
        refused with when ``in_flight`` requests are unfinished and ``prefill_tokens``
        prompt tokens belong to requests without a first token yet; None: admitted
        (``check_admission``, vllm/v1/engine/async_llm.py:343–374 @ 0.32.0)."""
        q = self.max_num_queued_reqs
        if q is not None and in_flight + n > q:
            return "max_num_queued_reqs"
        t = self.max_num_queued_tokens
        if t is not None and prefill_tokens >= t:
            return "max_num_queued_tokens"
        return None
