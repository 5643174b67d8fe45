"""The streaming OpenAI-API client: one request → one :class:`RequestRecord`, and the
pre-flight check of ``/v1/models``.

Every request goes through the ramp's single :class:`aiohttp.ClientSession` (its
connector limit ≥ the largest level, see :mod:`app.loadgen.runner`). Chunk arrival
time = ``time.monotonic()`` when the read that completed the event returned.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from app.loadgen.records import (STATUS_DISCONNECTED, STATUS_SERVER_ERROR, STATUS_TIMEOUT, RequestRecord)
from app.loadgen.sse import DONE, SSEParser, choice_has_output, error_message, interpret, loads

import numpy as np


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


async def stream_request(session: aiohttp.ClientSession, url: str, body: bytes, *, level_idx: int,
                         level: float, t0: float, timeout: aiohttp.ClientTimeout,
                         headers: dict | None = None, est_prompt_tokens: int | None = None) -> RequestRecord:
    """Send one streaming request and time it; never raises for request failures.

    ``t0``: the session clock's origin (``time.monotonic()`` value); record times are
    relative to it. ``timeout``: the whole request's limit. Returns the record with
    status ``ok``, ``http_<code>`` (the server's message in ``error``), ``timeout``,
    ``disconnected`` (connect failure, reset, stream ended without ``[DONE]``) or
    ``server_error`` (error object mid-stream or an unreadable chunk).
    """
    mono = time.monotonic
    parser = SSEParser()
    arrivals: list[float] = []
    usage = None
    status, error = "ok", None
    done = False
    start = mono()
    end = start
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
            else:
                async for data in resp.content.iter_any():
                    now = mono()
                    for payload in parser.feed(data):
                        if payload == DONE:
                            done = True
                            continue
                        obj = loads(payload)
                        choices = obj.get("choices") if type(obj) is dict else None
                        if choices:  # fast path: a token chunk (interpret() has the rules)
                            if choice_has_output(choices[0]):
                                arrivals.append(now)
                            u = obj.get("usage")
                            if u:
                                usage = (u.get("prompt_tokens"), u.get("completion_tokens"))
                            continue
                        c = interpret(payload)
                        if c.output:
                            arrivals.append(now)
                        if c.usage is not None:
                            usage = c.usage
                        if c.error is not None:
                            status, error = STATUS_SERVER_ERROR, c.error
                        if c.done:
                            done = True
                    if status != "ok":
                        break
                end = mono()
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
                        tokens_source="counted", status=status, error=error, chunk_offsets=offs)
    if usage is not None:
        pt, ct = usage
        if pt is not None:
            rec.prompt_tokens = int(pt)
        if ct is not None:
            rec.output_tokens = int(ct)
            rec.tokens_source = "server_usage"
    return rec
