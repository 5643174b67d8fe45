"""Issue 20 item 1 against the real CPU build: a short ramp from a ShareGPT-format file
sends the file's prompts and gets, per request, the output length of the dataset's
answer (``max_tokens`` from the answer, ``ignore_eos`` keeps it exact); the length
histograms are kept with the run."""
from __future__ import annotations

import json


from app.config import ServerConfig
from app.loadgen.prompts import dataset_lengths
from app.loadgen.spec import RampSpec
from app.run.controller import LaunchTarget, RecordSpec, RunController
from app.store import RunStore

#: (prompt words, answer words) of the file's conversations; answers of distinct lengths
SHAPES = [(12, 8), (30, 16), (6, 24), (20, 40), (9, 5), (15, 32)]


def test_a_sharegpt_ramp_gets_the_datasets_output_lengths(vllm_server, tmp_path, dyno_home):
    convs = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": " ".join(["tell me about the sea"] * (p // 5) + ["please"] * (p % 5))},
        {"from": "gpt", "value": " ".join(["waves"] * a)},
        {"from": "human", "value": "thanks"}]} for i, (p, a) in enumerate(SHAPES)]
    f = tmp_path / "sharegpt.json"
    f.write_text(json.dumps(convs))
    spec = RampSpec(url=vllm_server.url, model="tiny", levels=[1, 4], requests_per_level=12, step_seconds=None,
                    prompts_file=f, endpoint="/v1/chat/completions", request_timeout=60, seed=7)
    answers = {a for _, a in SHAPES}
    assert dataset_lengths(spec)["output"]["max"] == 40
    ctl = RunController()
    with RunStore() as store:
        try:
            ctl.launch(LaunchTarget("attach", ServerConfig(model="tiny"), attach_url=vllm_server.url,
                                    attach_model="tiny", telemetry=False))
            res = ctl.ramp(spec, record=RecordSpec(name="e2e dataset"), timeout=300)
        finally:
            ctl.stop()
        assert res.status == "done", res.stop_reason
        ok = [r for r in res.records if r.ok]
        assert len(ok) >= 24 and len(ok) == len(res.records)
        outs = [r.output_tokens for r in ok]
        print("output tokens:", outs)
        assert all(r.tokens_source == "server_usage" for r in ok)
        assert set(outs) <= answers and len(set(outs)) >= 5  # each request: its answer's length, exactly
        # the same seed draws the same entries: the first requests sent are the sampler's first
        run = store.get_run(res.run_id)
        assert run["config"]["lengths"]["entries"] == len(SHAPES)
        assert run["config"]["lengths"]["output"]["max"] == 40
