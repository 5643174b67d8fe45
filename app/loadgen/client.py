"""The streaming OpenAI-API client: one request → one :class:`RequestRecord`, and the
pre-flight check of ``/v1/models``.

Every request goes through the ramp's single :class:`aiohttp.ClientSession` (its
connector limit ≥ the largest level, see :mod:`app.loadgen.runner`). Chunk arrival
time = ``time.monotonic()`` when the read that completed the event returned.
"""
from __future__ import annotations

import asyncio
import collections
import email.utils
import json
import time

from typing import Any, Callable

import aiohttp

from app.loadgen.records import (REJECTED_STATUS, STATUS_DISCONNECTED, STATUS_REJECTED, STATUS_SERVER_ERROR,
                                 STATUS_TIMEOUT, RequestRecord)
from app.loadgen.sse import DONE, SSEParser, choice_has_output, error_message, interpret, loads

import numpy as np


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header's wait in s: delay-seconds, or an HTTP-date less now
    (RFC 9110 §10.2.3); None when absent or unreadable."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_code(obj: object) -> object:
    """The ``code`` of a stream's error event (``{"error": {"code": 503, …}}``), else None."""
    err = obj.get("error") if isinstance(obj, dict) else None
    return err.get("code") if isinstance(err, dict) else None


class PreflightError(Exception):
    """The server cannot be ramped as asked (unreachable, not OpenAI-compatible, wrong
    model name); the message says what to fix."""


async def preflight(session: aiohttp.ClientSession, base_url: str, model: str | None,
                    headers: dict | None = None, timeout: float = 10.0) -> tuple[str, dict]:
    """Check ``GET {base_url}/v1/models`` and return ``(model name, its entry)``.

    ``model`` None picks the first model served. Raises :class:`PreflightError` when
    nothing answers within ``timeout`` s, the answer is not a model list, or ``model``
    is not among the served ids (the message lists them).
    """
    url = f"{base_url}/v1/models"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status in (401, 403):
                raise PreflightError(f"{url} refused the request (HTTP {r.status}): set the API key "
                                     "in the environment (VLLM_API_KEY or OPENAI_API_KEY)")
            if r.status != 200:
                raise PreflightError(f"{url} answered HTTP {r.status}: is {base_url} an OpenAI-compatible server?")
            data = await r.json(content_type=None)
    except aiohttp.ClientConnectorError as e:
        why = getattr(e, "strerror", None) or str(e)
        raise PreflightError(f"cannot reach {base_url} ({why}): is the server running and the URL right?") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise PreflightError(f"no answer from {url} within {timeout:g} s: is the server up (it may still be loading)?") from None
    except (aiohttp.ClientError, ValueError) as e:
        raise PreflightError(f"{url}: bad answer ({e}): is {base_url} an OpenAI-compatible server?") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise PreflightError(f"{url} did not return a model list: is {base_url} an OpenAI-compatible server?")
    ids = {str(m.get("id")): m for m in entries if isinstance(m, dict)}
    if not ids:
        raise PreflightError(f"{url} lists no models: the server has nothing loaded")
    if model is None:
        name = next(iter(ids))
        return name, ids[name]
    if model not in ids:
        raise PreflightError(f"model {model!r} is not served at {base_url}; it serves: {', '.join(ids)} "
                             f"(use --model {next(iter(ids))})")
    return model, ids[model]


async def tokens_per_word(session: aiohttp.ClientSession, base_url: str, model: str, sample: str,
                          headers: dict | None = None, timeout: float = 5.0) -> float | None:
    """Tokens per word of ``sample`` by the served model's own tokenizer, asked through
    vLLM's ``POST /tokenize`` (``{"model", "prompt", "add_special_tokens": false}`` →
    ``{"count": N}``). None when the server has no such endpoint or answers oddly — then
    synthetic prompts keep the one-token-per-word estimate."""
    words = len(sample.split())
    body = {"model": model, "prompt": sample, "add_special_tokens": False}
    try:
        async with session.post(f"{base_url}/tokenize", json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                return None
            data = await r.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, ValueError):
        return None
    count = data.get("count") if isinstance(data, dict) else None
    if not isinstance(count, int) or count <= 0 or words == 0:
        return None
    return count / words


#: id(StreamReader) → deque of (stream offset after a feed, monotonic time of the feed)
_FEEDS: dict[int, collections.deque] = {}


def time_feeds() -> None:
    """Time every body chunk when aiohttp feeds it to a response's StreamReader (in the
    protocol's ``data_received``), for the readers that :class:`_FeedClock` registers.

    Under a burst — one server step hands a token to every sequence at once — one event
    loop pass reads all the sockets and then resumes the request tasks one by one; a
    time taken when the task resumes adds the other streams' processing to this one's
    TTFT and ITL (≈ 3–5 ms median at 256 streams on 2 cores). aiohttp's StreamReader has
    ``__slots__``, so the hook is on the class; it is installed once, in the load
    generator's own process (:mod:`app.loadgen.worker`), and costs one dict lookup per
    feed. Without it, arrivals are timed when the task reads them.
    """
    from aiohttp.streams import StreamReader  # deferred: installed only in the load generator's own process

    if getattr(StreamReader, "_dyno_timed", False):
        return
    orig = StreamReader.feed_data
    mono = time.monotonic
    feeds = _FEEDS

    def feed_data(self: StreamReader, data: bytes, *args: Any) -> None:
        q = feeds.get(id(self))
        if q is not None and data:
            q.append((self.total_bytes + len(data), mono()))
        orig(self, data, *args)

    # patched on the class (its __slots__ leave no room on an instance), by name: a method
    # replaced at run time and a marker attribute the class does not declare
    setattr(StreamReader, "feed_data", feed_data)
    setattr(StreamReader, "_dyno_timed", True)


class _FeedClock:
    """Arrival times of one response's body bytes (see :func:`time_feeds`).

    ``split(data)``: ``data`` is what one ``readany()`` returned (the feeds buffered
    since the last read, in order); returns ``[(piece, t)]``, one piece per feed with
    the monotonic time it arrived. Bytes whose feed was not timed (fed before this
    object existed, or :func:`time_feeds` not installed) are timed at the read.
    Call :meth:`close` when the response is done.
    """

    __slots__ = ("_key", "_feeds", "_consumed", "_mono")

    def __init__(self, reader: object, mono: Callable[[], float]) -> None:
        self._mono = mono
        self._key = id(reader)
        self._feeds: collections.deque = collections.deque()
        self._consumed = getattr(reader, "total_bytes", 0)
        _FEEDS[self._key] = self._feeds

    def split(self, data: bytes) -> list[tuple[bytes, float]]:
        start = self._consumed
        end = start + len(data)
        self._consumed = end
        feeds = self._feeds
        if len(feeds) == 1 and feeds[0][0] == end:  # the usual case: one feed per read
            return [(data, feeds.popleft()[1])]
        out: list[tuple[bytes, float]] = []
        pos = start
        while feeds and feeds[0][0] <= end:
            off, t = feeds.popleft()
            if off > pos:
                out.append((data[pos - start: off - start], t))
                pos = off
        if pos < end:  # bytes fed before this clock existed, or no hook: timed now
            out.append((data[pos - start:], self._mono()))
        return out

    def close(self) -> None:
        _FEEDS.pop(self._key, None)


async def stream_request(session: aiohttp.ClientSession, url: str, body: bytes, *, level_idx: int,
                         level: float, t0: float, timeout: aiohttp.ClientTimeout,
                         headers: dict | None = None, est_prompt_tokens: int | None = None,
                         text_out: list[str] | None = None) -> RequestRecord:
    """Send one streaming request and time it; never raises for request failures.

    ``t0``: the session clock's origin (``time.monotonic()`` value); record times are
    relative to it. ``timeout``: the whole request's limit. Returns the record with
    status ``ok``, ``rejected`` (HTTP 503: the server's admission control refused it; its
    ``Retry-After`` in ``retry_after``), ``http_<code>`` (the server's message in ``error``), ``timeout``,
    ``disconnected`` (connect failure, reset, stream ended without ``[DONE]``) or
    ``server_error`` (error object mid-stream or an unreadable chunk). For a complete
    stream ``e2e`` ends at the last output chunk (as ``vllm bench serve``), not at
    ``[DONE]``; for a failed one, when the failure was seen. ``text_out``: a list to
    append the output text to, chunk by chunk (a multi-turn conversation sends the reply
    it received back as history); None: the text is not kept.
    """
    mono = time.monotonic
    parser = SSEParser()
    arrivals: list[float] = []
    usage = None
    status, error = "ok", None
    done = False
    t_done = 0.0
    start = mono()
    end = start
    retry_after = None
    t_answer: float | None = None  # the first output chunk that is not reasoning
    n_reasoning = 0  # output chunks that were reasoning (delta.reasoning / reasoning_content)
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                text = await resp.text(errors="replace")
                end = mono()
                try:
                    error = error_message(json.loads(text))
                except ValueError:
                    error = text.strip()[:2000] or resp.reason
                status = f"http_{resp.status}"
                if resp.status == REJECTED_STATUS:
                    status, retry_after = STATUS_REJECTED, retry_after_s(resp.headers.get("Retry-After"))
            else:
                reader = resp.content
                fed = _FeedClock(reader, mono)
                try:
                    while True:
                        data = await reader.readany()
                        if not data:
                            break
                        for piece, now in fed.split(data):
                            for payload in parser.feed(piece):
                                if payload == DONE:
                                    done, t_done = True, now
                                    continue
                                obj = loads(payload)
                                choices = obj.get("choices") if type(obj) is dict else None
                                if choices:  # fast path: a token chunk (interpret() has the rules)
                                    if choice_has_output(choices[0]):
                                        arrivals.append(now)
                                        d = choices[0].get("delta")
                                        if d and (d.get("reasoning") or d.get("reasoning_content")):
                                            n_reasoning += 1
                                        elif t_answer is None:
                                            t_answer = now
                                        if text_out is not None:
                                            ch = choices[0]
                                            t = ch.get("text")
                                            if t is None:
                                                t = (ch.get("delta") or {}).get("content")
                                            if t:
                                                text_out.append(t)
                                    u = obj.get("usage")
                                    if u:
                                        usage = (u.get("prompt_tokens"), u.get("completion_tokens"))
                                    continue
                                c = interpret(payload)
                                if c.output:
                                    arrivals.append(now)
                                    if t_answer is None:
                                        t_answer = now
                                    if text_out is not None and c.text:
                                        text_out.append(c.text)
                                if c.usage is not None:
                                    usage = c.usage
                                if c.error is not None:
                                    status, error = STATUS_SERVER_ERROR, c.error
                                    if not arrivals and _error_code(obj) == REJECTED_STATUS:
                                        # vLLM checks admission again when it registers the request,
                                        # after tokenization: a stream already begun carries the 503 as
                                        # its error event (vllm/v1/engine/async_llm.py:569 @ 0.32.0)
                                        status = STATUS_REJECTED
                                if c.done:
                                    done, t_done = True, now
                        if status != "ok":
                            break
                finally:
                    fed.close()
                end = t_done if done else mono()
                if status == "ok" and done and arrivals:
                    # e2e (and so TPOT) ends at the last output chunk, as ``vllm bench
                    # serve`` measures it: a usage-only final chunk or the [DONE] marker
                    # that follows is not a token (vllm/benchmarks/lib/
                    # endpoint_request_func.py @ 0.32.0: ``output.latency =
                    # most_recent_timestamp - st``, advanced only by chunks with choices)
                    end = arrivals[-1]
                if status == "ok" and not done:
                    status, error = STATUS_DISCONNECTED, "the stream ended without [DONE]"
    except (asyncio.TimeoutError, TimeoutError):
        end = mono()
        status, error = STATUS_TIMEOUT, f"no complete answer within {timeout.total:g} s"
    except aiohttp.ClientConnectorError as e:
        end = mono()
        status, error = STATUS_DISCONNECTED, f"cannot connect: {getattr(e, 'strerror', None) or e}"
    except aiohttp.ClientError as e:
        end = mono()
        status, error = STATUS_DISCONNECTED, f"{type(e).__name__}: {e}"
    except ValueError as e:  # a chunk that is not JSON
        end = mono()
        status, error = STATUS_SERVER_ERROR, f"unreadable stream chunk: {e}"
    offs = (np.asarray(arrivals, dtype=np.float64) - start).astype(np.float32) if arrivals else np.zeros(0, np.float32)
    rec = RequestRecord(level_idx=level_idx, level=level, t_start=start - t0,
                        ttft=(arrivals[0] - start) if arrivals else None, e2e=end - start,
                        prompt_tokens=est_prompt_tokens, output_tokens=len(arrivals),
                        tokens_source="counted", status=status, error=error, chunk_offsets=offs,
                        retry_after=retry_after, ttfa=(t_answer - start) if t_answer is not None else None)
    if usage is not None:
        pt, ct = usage
        if pt is not None:
            rec.prompt_tokens = int(pt)
        if ct is not None:
            rec.output_tokens = int(ct)
            rec.tokens_source = "server_usage"
    if n_reasoning:
        rec.reasoning_tokens = round(n_reasoning * rec.output_tokens / len(arrivals)) if arrivals else n_reasoning
    return rec
