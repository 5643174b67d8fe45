"""Per-request record of a ramp.

Times are seconds on the session clock (:class:`app.clock.SessionClock`: monotonic
seconds since the session start). Chunk arrivals are kept compactly as float32 offsets
(seconds after ``t_start``; ~0.1 µs resolution at 1 s, ~1 µs at 10 s — well below the
clock's jitter) — one per streamed chunk that carried output.

Definitions follow ``vllm bench serve`` (vllm/benchmarks/serve.py):
TTFT = first output chunk − send; ITL = gaps between consecutive output chunks (per
chunk, so a chunk holding k tokens is one gap); TPOT = (e2e − TTFT) / (output tokens − 1)
(per token); e2e = last output chunk − send (vLLM's ``latency``: a usage-only final
chunk or ``[DONE]`` after it does not count).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: request outcomes (``http_<code>`` is formed from the status code)
STATUS_OK = "ok"
STATUS_TIMEOUT = "timeout"
STATUS_DISCONNECTED = "disconnected"
STATUS_SERVER_ERROR = "server_error"
#: the server refused the request with HTTP 503, or a 503 error event before any output (vLLM's
#: admission control, app.engine.admission):
#: not a failure — counted apart (``StepStats.rejected``), out of the failure rate
STATUS_REJECTED = "rejected"
#: the HTTP status of such a refusal (vllm/exceptions.py:168, :183 @ 0.32.0: ``HTTPStatus.SERVICE_UNAVAILABLE``)
REJECTED_STATUS = 503


def _empty() -> np.ndarray:
    return np.zeros(0, dtype=np.float32)


@dataclass(slots=True)
class RequestRecord:
    """One request.

    ``level_idx``: index of the ramp level; ``level``: its concurrency (or rate, req/s).
    ``t_start``: send time (session-clock s). ``ttft``: s, None when no output chunk
    arrived (undefined, not 0). ``e2e``: s until the last output chunk of a complete
    stream (``vllm bench serve``'s latency: a trailing usage chunk or ``[DONE]`` does not
    count), or until a failed request failed.
    ``chunk_offsets``: float32 s after ``t_start`` of each output chunk.
    ``prompt_tokens``/``output_tokens``: from the server's usage chunk when sent
    (``tokens_source`` = ``server_usage``), else output tokens = output chunks counted
    (``counted``) and prompt tokens = the generator's estimate (``estimated``).
    ``status``: ``ok``, ``rejected`` (HTTP 503), ``http_<code>``, ``timeout``, ``disconnected``,
    ``server_error``. ``retry_after``: a rejection's ``Retry-After`` header, s (None: none sent).
    ``ttfa``: time to first answer token, s after the send — the first output chunk that is
    not reasoning (a reasoning model streams ``delta.reasoning`` first: vLLM 0.32's
    ``DeltaMessage.reasoning``, vllm/entrypoints/generate/base/protocol.py:359; older
    versions ``reasoning_content``); equal to ``ttft`` for a stream without reasoning, None
    without an answer. ``reasoning_tokens``: its output tokens that were reasoning (the
    reasoning chunks × output tokens per chunk).
    ``error``: the error text (the server's message where it sent one).
    ``turn``: the turn of its conversation in a multi-turn ramp (1, 2, …; 0: not a
    conversation's turn).
    """

    level_idx: int
    level: float
    t_start: float
    ttft: float | None = None
    e2e: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    tokens_source: str = "counted"
    status: str = STATUS_OK
    error: str | None = None
    chunk_offsets: np.ndarray = field(default_factory=_empty)
    turn: int = 0
    retry_after: float | None = None
    ttfa: float | None = None
    reasoning_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def rejected(self) -> bool:
        """Refused by the server's admission control (HTTP 503): neither a success nor a failure."""
        return self.status == STATUS_REJECTED

    @property
    def failed(self) -> bool:
        """Neither a success nor a rejection (the failure rate counts these)."""
        return self.status != STATUS_OK and self.status != STATUS_REJECTED

    @property
    def t_end(self) -> float:
        """Session-clock time the request ended (``t_start + e2e``)."""
        return self.t_start + (self.e2e or 0.0)

    @property
    def itl(self) -> np.ndarray:
        """Inter-chunk latencies in s (float64), one fewer than output chunks."""
        return np.diff(self.chunk_offsets.astype(np.float64))

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, s; None with fewer than 2 tokens."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_tuple(self) -> tuple:
        """Compact picklable form (for the pipe); inverse of :meth:`from_tuple`."""
        return (self.level_idx, self.level, self.t_start, self.ttft, self.e2e, self.prompt_tokens,
                self.output_tokens, self.tokens_source, self.status, self.error, self.chunk_offsets, self.turn,
                self.retry_after, self.ttfa, self.reasoning_tokens)

    @classmethod
    def from_tuple(cls, t: tuple) -> "RequestRecord":
        return cls(*t)

    def to_dict(self) -> dict:
        """JSON-ready dict (chunk offsets as a list of floats)."""
        return {"level_idx": self.level_idx, "level": self.level, "t_start": self.t_start, "ttft": self.ttft,
                "e2e": self.e2e, "tpot": self.tpot, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "tokens_source": self.tokens_source,
                "status": self.status, "error": self.error,
                "chunk_offsets": [round(float(x), 6) for x in self.chunk_offsets], "turn": self.turn,
                "retry_after": self.retry_after, "ttfa": self.ttfa, "reasoning_tokens": self.reasoning_tokens}
