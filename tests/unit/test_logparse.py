from app.server.logparse import LogParser, strip_ansi

V032 = """\
(APIServer pid=4242) INFO 11-30 12:00:01 [api_server.py:1900] vLLM API server version 0.32.0
(APIServer pid=4242) INFO 11-30 12:00:01 [utils.py:253] non-default args: {'model': '/m', 'max_num_seqs': 8, 'served_model_name': ['tiny']}
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:20 [default_loader.py:291] Loading weights took 0.01 seconds
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:20 [gpu_model_runner.py:3100] Model loading took 0.0054 GiB memory and 0.123 seconds
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:30 [gpu_worker.py:298] Available KV cache memory: 1.00 GiB
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:30 [kv_cache_utils.py:1087] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 2,048 tokens per request: 512.00x
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:40 [gpu_model_runner.py:3900] Graph capturing finished in 12 secs, took 0.52 GiB
(EngineCore_DP0 pid=4300) INFO 11-30 12:00:41 [core.py:210] init engine (profile, create kv cache, warmup model) took 36.45 seconds
(APIServer pid=4242) INFO:     Application startup complete.
(APIServer pid=4242) INFO 11-30 12:01:00 [loggers.py:236] Engine 000: Avg prompt throughput: 1,234.5 tokens/s, Avg generation throughput: 857.3 tokens/s, Running: 8 reqs, Waiting: 8 reqs, GPU KV cache usage: 0.4%, Prefix cache hit rate: 12.5%
"""

# 0.10.x: ANSI-coloured prefix, capacity on two lines, "GPU KV cache size"
V010 = (
    "\x1b[1;36m(VllmWorker TP0 pid=77)\x1b[0;0m INFO 08-01 10:00:00 [gpu_model_runner.py:1892] Model loading took 9.2873 GiB and 5.91 seconds\n"
    "\x1b[1;36m(EngineCore_0 pid=70)\x1b[0;0m INFO 08-01 10:00:09 [kv_cache_utils.py:833] GPU KV cache size: 231,440 tokens\n"
    "\x1b[1;36m(EngineCore_0 pid=70)\x1b[0;0m INFO 08-01 10:00:09 [kv_cache_utils.py:837] Maximum concurrency for 8,192 tokens per request: 28.25x\n"
    "\x1b[32mINFO\x1b[0m 08-01 10:00:30 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 37.1 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%, Prefix cache hit rate: 0.0%\n"
)


def test_parses_032_startup_and_stats():
    f = LogParser().feed_text(V032)
    assert f.version == "0.32.0"
    assert f.non_default_args["max_num_seqs"] == 8
    assert (f.model_loading_gib, f.model_loading_s) == (0.0054, 0.123)
    assert f.available_kv_cache_gib == 1.0
    assert (f.kv_cache_device, f.kv_cache_tokens) == ("CPU", 1_048_576)
    assert (f.max_concurrency_tokens_per_request, f.max_concurrency) == (2048, 512.0)
    assert (f.cuda_graph_s, f.cuda_graph_gib) == (12.0, 0.52)
    assert f.engine_init_s == 36.45 and f.ready
    s = f.last_stats
    assert (s.engine, s.prompt_tps, s.generation_tps, s.running, s.waiting) == (0, 1234.5, 857.3, 8, 8)
    assert s.kv_cache_usage_pct == 0.4 and s.prefix_cache_hit_pct == 12.5


def test_parses_010_ansi_two_line_format():
    p = LogParser()
    kinds = [p.feed(l) for l in V010.splitlines()]
    f = p.facts
    assert kinds[1] == ["kv_tokens"] and kinds[2] == ["max_conc"]
    assert (f.model_loading_gib, f.model_loading_s) == (9.2873, 5.91)
    assert (f.kv_cache_device, f.kv_cache_tokens) == ("GPU", 231_440)
    assert f.max_concurrency == 28.25 and f.max_concurrency_tokens_per_request == 8192
    assert f.last_stats.generation_tps == 37.1 and not f.ready


def test_strip_ansi_and_garbage_lines():
    assert strip_ansi("\x1b[1;36m(X)\x1b[0;0m hi\r\n") == "(X) hi"
    p = LogParser()
    for junk in ["", "non-default args: {not python", "KV cache size: lots", "\x00\xff"]:
        p.feed(junk)
    assert p.facts.kv_cache_tokens is None and p.facts.non_default_args is None
