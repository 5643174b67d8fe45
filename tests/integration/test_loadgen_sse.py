"""SSE parser and stream timing: unit tests and every case in tests/cases/streaming/."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest
import yaml

from app.loadgen.client import stream_request
from app.loadgen.sse import SSEParser, interpret
from tests.conftest import CASES
from tests.loadgen_server import Script, ScriptedServer

CASE_FILES = sorted((CASES / "streaming").glob("*.yaml"))
TOL = 0.03  # s: a loaded 2-core machine; the cases' delays are 50 ms – 2.2 s


def parse_all(reads: list[bytes]) -> list[list[bytes]]:
    p = SSEParser()
    return [p.feed(r) for r in reads]


def test_parser_basics():
    assert parse_all([b"data: a\n\ndata: b\n\n"]) == [[b"a", b"b"]]
    assert parse_all([b"data: a\n", b"\n"]) == [[], [b"a"]]
    assert parse_all([b"data:x\r\n\r\n"]) == [[b"x"]]
    assert parse_all([b"data: x\r", b"\n\r\n"]) == [[], [b"x"]]  # CRLF cut between reads
    assert parse_all([b": keep-alive\n\n", b"event: foo\ndata: y\n\n"]) == [[], [b"y"]]
    assert parse_all([b"data: 1\ndata: 2\n\n"]) == [[b"1\n2"]]  # multi-line data joined with \n
    assert parse_all([b"data:  two spaces\n\n"]) == [[b" two spaces"]]  # only one space is stripped


def test_parser_any_split_gives_same_events():
    stream = (b'data: {"choices":[{"text":"a b"}]}\r\n\r\n: c\n\ndata:{"choices":[{"text":" c"}]}\n\n'
              b'data: [DONE]\n\n')
    whole = parse_all([stream])[0]
    for i in range(len(stream)):
        for j in range(i, len(stream)):
            got = sum(parse_all([stream[:i], stream[i:j], stream[j:]]), [])
            assert got == whole, (i, j)


def test_parser_close_and_limit():
    p = SSEParser()
    assert p.feed(b"data: tail") == []
    assert p.close() == [b"tail"]
    p = SSEParser(max_event_bytes=10)
    with pytest.raises(ValueError, match="without an end"):
        p.feed(b"data: " + b"x" * 100)


def test_interpret():
    assert interpret(b"[DONE]").done
    c = interpret(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
    assert not c.output
    assert interpret(b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}').output
    assert interpret(b'{"choices":[{"text":" x"}]}').text == " x"
    assert interpret(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}').usage == (3, 2)
    assert interpret(b'{"choices":[{"text":"a"}],"usage":null}').usage is None
    assert interpret(b'{"error":{"message":"boom","code":500}}').error == "boom"
    assert interpret(b'{"object":"error","message":"old style"}').error == "old style"
    with pytest.raises(ValueError):
        interpret(b"{not json")


# ---- the field cases -------------------------------------------------------------------

def load_case(path):
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", [p for p in CASE_FILES if "reads" in load_case(p)], ids=lambda p: p.stem)
def test_case_reads_parser(path):
    case = load_case(path)
    exp = case["expect"]
    p = SSEParser()
    events, text, usage, first_token_read = 0, "", None, None
    for i, r in enumerate(case["reads"], 1):
        for payload in p.feed(r.encode()):
            c = interpret(payload)
            if c.done:
                continue
            events += 1
            text += c.text
            if c.usage:
                usage = c.usage
            if c.output and first_token_read is None:
                first_token_read = i
    assert events == exp["events"]
    assert text == exp["text"]
    assert usage[1] == exp["completion_tokens"]
    assert first_token_read == exp["first_token_read"]


def _measure(script: Script, chat: bool = True):
    """One request through the real client against the scripted server."""
    async def go():
        with ScriptedServer(script) as srv:
            async with aiohttp.ClientSession() as s:
                body = {"model": "scripted", "stream": True, "max_tokens": 4}
                if chat:
                    body["messages"] = [{"role": "user", "content": "hi"}]
                else:
                    body["prompt"] = "hi"
                path = "/v1/chat/completions" if chat else "/v1/completions"
                return await stream_request(s, srv.url + path, json.dumps(body).encode(), level_idx=0, level=1,
                                            t0=0.0, timeout=aiohttp.ClientTimeout(total=30))
    return asyncio.run(go())


def _check(rec, exp):
    assert rec.status == "ok", rec.error
    if "ttft_s" in exp:
        if exp["ttft_s"] is None:
            assert rec.ttft is None
        else:
            assert rec.ttft == pytest.approx(exp["ttft_s"], abs=TOL)
    if "itl_s" in exp:
        np.testing.assert_allclose(rec.itl, exp["itl_s"], atol=TOL)
    if "output_tokens" in exp:
        assert rec.output_tokens == exp["output_tokens"]
    if "e2e_s" in exp:
        assert rec.e2e == pytest.approx(exp["e2e_s"], abs=TOL)
    if "tpot_s" in exp:
        assert rec.tpot == pytest.approx(exp["tpot_s"], abs=TOL)
    if "output_tokens_source" in exp:
        assert rec.tokens_source == exp["output_tokens_source"]


def _variants(case):
    """The case's events and expect, then each variant's (tests/cases/README.md)."""
    out = [("base", case["events"], case["expect"])]
    for k, v in enumerate(case.get("variants", [])):
        (how, arg), = v["change"].items()
        if how == "replace_events":
            ev = arg
        elif how == "insert_event":
            ev = sorted(case["events"] + [arg], key=lambda e: e[0])
        elif how == "drop_usage_chunk" and arg:
            ev = [e for e in case["events"] if '"usage"' not in e[1]]
        else:
            raise AssertionError(f"{case['id']}: change not understood by this test: {v['change']}")
        out.append((f"variant{k}", ev, dict(v["expect"])))  # a variant's expect stands alone
    return out


TIMED = [(p, name, ev, exp) for p in CASE_FILES if "events" in load_case(p)
         for name, ev, exp in _variants(load_case(p))]


@pytest.mark.parametrize("path,name,events,expect", TIMED, ids=[f"{p.stem}-{n}" for p, n, _, _ in TIMED])
def test_case_events_timing(path, name, events, expect):
    chat = any('"delta"' in e[1] for e in events)
    rec = _measure(Script(events=events), chat=chat)
    _check(rec, expect)
    if "usage" not in json.dumps(events) and "output_tokens" in expect:
        assert rec.tokens_source == "counted"


def test_case_reads_timing():
    """The split/merged reads case over a real socket: TTFT is the third read."""
    case = load_case(CASES / "streaming" / "sse-split-and-merged-reads.yaml")
    rec = _measure(Script(reads=case["reads"], read_gap=0.1))
    assert rec.status == "ok" and rec.output_tokens == 2 and rec.tokens_source == "server_usage"
    assert rec.ttft == pytest.approx(0.2, abs=TOL)  # reads 1, 2 (role only) then 3 (first token)
