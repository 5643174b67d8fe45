"""Issue 20 item 1: datasets behind --prompts-file — each format, each bad file, the
built-in chat-like dataset, the Hugging Face cache, the sampling and lengths rule that
both the load generator and the planner use, the histograms shown and stored."""
from __future__ import annotations

import csv
import json
import os
import statistics
import time

import pytest
from pydantic import ValidationError

from app.loadgen import datasets
from app.loadgen.datasets import DatasetError, builtin_chat, hf_dataset_file, load_dataset
from app.loadgen.prompts import LengthSampler, RequestFactory, dataset_lengths, planned_lengths
from app.loadgen.spec import RampSpec


def words(n: int, w: str = "word") -> str:
    return " ".join([w] * n)


def sharegpt(prompt_n: int, answer_n: int) -> dict:
    return {"id": "x", "conversations": [{"from": "human", "value": words(prompt_n)},
                                         {"from": "gpt", "value": words(answer_n, "reply")},
                                         {"from": "human", "value": "and then?"}]}


# ---- formats ------------------------------------------------------------------------------

def test_sharegpt_json_list_and_jsonl(tmp_path):
    recs = [sharegpt(10, 30), sharegpt(5, 7), {"conversations": []}, sharegpt(3, 50)]
    js = tmp_path / "sg.json"
    js.write_text(json.dumps(recs, indent=1))
    jl = tmp_path / "sg.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    for f in (js, jl):
        ds = load_dataset(f)
        assert ds.format == "sharegpt" and ds.skipped == 1 and ds.has_answers and not ds.synthetic
        assert [(e.prompt_tokens, e.answer_tokens) for e in ds.entries] == [(10, 30), (5, 7), (3, 50)]
        assert ds.entries[0].prompt == words(10)
    assert load_dataset(js, "sharegpt").entries == load_dataset(js).entries


def test_sharegpt_json_list_streams_items_across_read_chunks(tmp_path):
    """A list read 64 KiB, then 1 MiB at a time: items bigger than a chunk are decoded whole."""
    recs = [sharegpt(30_000, 5), sharegpt(2, 40_000), sharegpt(4, 4)]
    f = tmp_path / "big.json"
    f.write_text(json.dumps(recs))
    assert [(e.prompt_tokens, e.answer_tokens) for e in load_dataset(f).entries] == [(30_000, 5), (2, 40_000), (4, 4)]


def test_chat_jsonl_takes_a_last_assistant_message_as_the_answer(tmp_path):
    f = tmp_path / "chat.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": [{"type": "text", "text": "tell me more"}]},
                                          {"role": "assistant", "content": words(12)}]}) + "\n"
                 + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    ds = load_dataset(f)
    assert ds.format == "chat"
    a, b = ds.entries
    assert a.prompt == [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": "tell me more"}]}]
    assert (a.prompt_tokens, a.answer_tokens) == (5, 12) and (b.prompt_tokens, b.answer_tokens) == (1, None)


def test_prompt_jsonl_keeps_working_with_an_optional_answer(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one two three"}\n{"prompt": "four", "completion": "a b c d e"}\n')
    ds = load_dataset(f)
    assert ds.format == "prompt" and [(e.prompt, e.answer_tokens) for e in ds.entries] == [
        ("one two three", None), ("four", 5)]


def test_csv_detects_the_text_and_answer_columns_or_takes_the_named_one(tmp_path):
    f = tmp_path / "q.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "Question", "answer", "notes"])
        w.writerow([1, "what is, in short, a knee?", words(9), "a comma and \"quotes\""])
        w.writerow([2, "why", words(3), "multi\nline"])
    ds = load_dataset(f)
    assert ds.format == "csv" and [(e.prompt, e.prompt_tokens, e.answer_tokens) for e in ds.entries] == [
        ("what is, in short, a knee?", 6, 9), ("why", 1, 3)]
    named = load_dataset(f, column="notes")
    assert [e.prompt for e in named.entries] == ['a comma and "quotes"', "multi\nline"]


def test_parquet_text_column_and_conversations_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    f = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": ["a b c", "d e"], "response": [words(4), None]}), f)
    ds = load_dataset(f)
    assert ds.format == "parquet" and [(e.prompt, e.answer_tokens) for e in ds.entries] == [("a b c", 4), ("d e", None)]
    g = tmp_path / "sg.parquet"
    pq.write_table(pa.table({"conversations": [sharegpt(6, 11)["conversations"]]}), g)
    assert [(e.prompt_tokens, e.answer_tokens) for e in load_dataset(g).entries] == [(6, 11)]


# ---- bad files ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,text,fmt,match", [
    ("a.jsonl", '{"prompt": "ok"}\n{"prompt": "x"\n', None, r"a\.jsonl line 2: not JSON"),
    ("b.jsonl", '{"prompt": "ok"}\n{"text": 1}\n', None, r"line 2: no \"conversations\", \"messages\" or \"prompt\""),
    ("c.jsonl", '{"prompt": "ok"}\n', "sharegpt", r"line 1: not a sharegpt record .*--prompts-format"),
    ("d.json", '[{"conversations": [{"from": "human", "value": "x"}]}, {"conversations": "no"}]', None,
     r"item 2: \"conversations\" must be a list"),
    ("e.json", '[{"conversations": [{"from": "human"}]}]', None, r"item 1: turn 1 of \"conversations\""),
    ("f.json", '[{"prompt": "a"}, {"prompt": ', None, r"item 2: not JSON"),
    ("g.jsonl", '{"messages": "hi"}\n', None, r"line 1: \"messages\" must be a list"),
    ("h.jsonl", '\n\n', None, r"no prompts in it"),
    ("i.json", '[{"conversations": []}]', None, r"no prompts in it \(1 records without a prompt\)"),
    ("j.csv", 'id,body\n1,hello\n', None, r"no text column .*--prompts-column"),
    ("k.csv", 'prompt,answer\nhello,x\n,y\n', None, r"k\.csv line 3: the 'prompt' cell is empty"),
    ("l.jsonl", '"just text"\n', None, r"line 1: not a JSON object"),
    ("l2.json", '[1, 2]', None, r"item 1: not a JSON object"),
    ("m.jsonl", '{"prompt": 5}\n', None, r"line 1: \"prompt\" must be a string"),
])
def test_a_bad_file_names_the_file_the_line_and_the_fix(tmp_path, name, text, fmt, match):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(DatasetError, match=match):
        load_dataset(f, fmt)


def test_other_bad_sources(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "none.jsonl")
    with pytest.raises(DatasetError, match="no such built-in dataset: one of builtin:chat"):
        load_dataset("builtin:shakespeare")
    f = tmp_path / "x.csv"
    f.write_text("prompt\nhi\n")
    with pytest.raises(DatasetError, match="no column 'body'.*columns: prompt"):
        load_dataset(f, column="body")
    j = tmp_path / "x.jsonl"
    j.write_text('{"prompt": "a"}\n')
    with pytest.raises(DatasetError, match="a column is for CSV or Parquet"):
        load_dataset(j, column="text")
    bin_ = tmp_path / "x.bin"
    bin_.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DatasetError, match="not UTF-8"):
        load_dataset(bin_)
    with pytest.raises(DatasetError, match="not a Parquet file"):
        load_dataset(j, "parquet")
    with pytest.raises(ValidationError, match="prompts_format/prompts_column describe a prompts_file"):
        RampSpec(levels=[1], prompts_format="csv")


def test_reading_stops_at_the_bounds(tmp_path, monkeypatch):
    f = tmp_path / "many.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"p {i}"}) + "\n" for i in range(50)))
    monkeypatch.setattr(datasets, "MAX_ENTRIES", 20)
    ds = load_dataset(f)
    assert len(ds.entries) == 20 and ds.truncated and "first 20 entries" in ds.note
    monkeypatch.setattr(datasets, "MAX_ENTRIES", 1000)
    monkeypatch.setattr(datasets, "MAX_BYTES", 200)
    os.utime(f, ns=(time.time_ns(), time.time_ns() + 10**9))  # a new cache key
    ds = load_dataset(f)
    assert ds.truncated and 5 <= len(ds.entries) < 20
    g = tmp_path / "many.json"
    g.write_text(json.dumps([{"prompt": f"p {i}"} for i in range(50)]))
    monkeypatch.setattr(datasets, "MAX_BYTES", 100)
    assert load_dataset(g).truncated


# ---- built-in -----------------------------------------------------------------------------

def test_builtin_chat_follows_sharegpt_means_with_long_tails_and_vllms_pruning():
    """Means within 10 % of the vLLM paper's ShareGPT figures (161.31 in, 337.99 out,
    before the pruning); medians well below the means (long right tails); every entry
    within vLLM's ShareGPT pruning (prompt 4–1024, total ≤ 2048)."""
    es = builtin_chat()
    p = [e.prompt_tokens for e in es]
    o = [e.answer_tokens for e in es]
    assert len(es) == 1000 and all(e.prompt is None for e in es)
    assert abs(statistics.mean(p) / 161.31 - 1) < 0.10 and abs(statistics.mean(o) / 337.99 - 1) < 0.10
    assert statistics.median(p) < 0.75 * statistics.mean(p) and statistics.median(o) < 0.85 * statistics.mean(o)
    assert min(p) >= 4 and max(p) <= 1024 and all(a + b <= 2048 for a, b in zip(p, o)) and max(o) > 1000
    assert builtin_chat() == es  # fixed: the ramp's seed samples from it
    body, est, mx = RequestFactory(RampSpec(levels=[1], prompts_file="builtin:chat"), "m", tokens_per_word=2.0).next()
    assert len(json.loads(body)["prompt"].split()) == round(est / 2.0)  # synthetic words, scaled to the model


# ---- Hugging Face cache ------------------------------------------------------------------

def hf_layout(hub, repo: str, files: dict[str, str], commit: str = "0123abcd" * 5):
    """A dataset laid out as huggingface_hub lays it out: blobs, snapshots/<commit>/ with
    symlinks into them, refs/main naming the commit."""
    d = hub / ("datasets--" + repo.replace("/", "--"))
    (d / "refs").mkdir(parents=True)
    (d / "refs" / "main").write_text(commit)
    for i, (name, text) in enumerate(files.items()):
        blob = d / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_text(text)
        link = d / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return d / "snapshots" / commit


def test_a_dataset_from_the_hf_cache_is_used_and_never_downloaded(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    with pytest.raises(DatasetError, match=r"not in the Hugging Face cache \(looked in .*datasets--anon--"
                                           r"ShareGPT_Vicuna.*huggingface-cli download --repo-type dataset "
                                           r"anon/ShareGPT_Vicuna"):
        load_dataset("hf:anon/ShareGPT_Vicuna")
    snap = hf_layout(hub, "anon/ShareGPT_Vicuna", {
        "ShareGPT_V3_unfiltered_cleaned_split.json": json.dumps([sharegpt(8, 16)]),
        "HTML_cleaned_raw_dataset/sg_90k_part1.json": json.dumps([sharegpt(1, 2)]),
        "README.md": "# card"})
    assert hf_dataset_file("anon/ShareGPT_Vicuna") == snap / "ShareGPT_V3_unfiltered_cleaned_split.json"
    ds = load_dataset("hf:anon/ShareGPT_Vicuna")
    assert [(e.prompt_tokens, e.answer_tokens) for e in ds.entries] == [(8, 16)]
    part = load_dataset("hf:anon/ShareGPT_Vicuna/HTML_cleaned_raw_dataset/sg_90k_part1.json")
    assert [(e.prompt_tokens, e.answer_tokens) for e in part.entries] == [(1, 2)]
    hf_layout(hub, "org/qa", {"train.csv": "question\nq\n", "test.csv": "question\nr\n"})
    with pytest.raises(DatasetError, match="several data files .*name one, e.g. hf:org/qa/"):
        load_dataset("hf:org/qa")
    with pytest.raises(DatasetError, match=r"download --repo-type dataset org/qa dev\.csv"):
        load_dataset("hf:org/qa/dev.csv")
    spec = RampSpec(levels=[1], prompts_file="hf:anon/ShareGPT_Vicuna")
    assert spec.prompts_name == "hf:anon/ShareGPT_Vicuna" and "prompts from hf:anon/ShareGPT_Vicuna" in spec.shape


# ---- sampling and lengths: one rule for the generator and the planner ---------------------

def test_sampling_is_seeded_each_entry_once_a_pass_and_output_from_the_answers(tmp_path):
    f = tmp_path / "sg.jsonl"
    f.write_text("".join(json.dumps(sharegpt(i + 1, 10 * (i + 1))) + "\n" for i in range(7)))
    spec = RampSpec(levels=[1], prompts_file=f, seed=4)
    s = LengthSampler.of(spec)
    first, second = [s.next() for _ in range(7)], [s.next() for _ in range(7)]
    assert sorted(first) == sorted(second) == [(i, 10 * i) for i in range(1, 8)] and first != second
    again, other = LengthSampler.of(spec), LengthSampler.of(spec.model_copy(update={"seed": 5}))
    assert [again.next() for _ in range(7)] == first and [other.next() for _ in range(7)] != first
    capped = LengthSampler.of(spec.model_copy(update={"output_cap": 25}))
    assert sorted(o for _, o in (capped.next() for _ in range(7))) == [10, 20, 25, 25, 25, 25, 25]
    fac = RequestFactory(spec, "m")
    for _ in range(7):
        body, est, mx = fac.next()
        b = json.loads(body)
        assert b["max_tokens"] == mx == 10 * est and len(b["prompt"].split()) == est and b["ignore_eos"]
    assert "output from its answers (sampled, seed 4)" in spec.shape
    assert "(≤ 25 tokens)" in spec.model_copy(update={"output_cap": 25}).shape


def test_records_without_answers_draw_the_output_from_output_tokens(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a b"}\n{"prompt": "c d e", "response": "x y z"}\n')
    spec = RampSpec(levels=[1], prompts_file=f, output_tokens=50, length_spread=0)
    assert sorted(planned_lengths(spec, 2)) == [(2, 50), (3, 3)]


def test_the_planner_predicts_with_the_datasets_lengths(tmp_path):
    """app.planner.predict runs the ramp's LengthSampler: the predicted requests carry the
    dataset's prompt and output lengths, in the order the generator sends them."""
    # deferred: only this test plans, and the sim's planner modules are heavy to import
    from app.planner.predict import EngineLimits, predict_ramp
    from app.profiles.io import read_profile
    from app.sim import model_adapter as ma

    f = tmp_path / "sg.jsonl"
    f.write_text("".join(json.dumps(sharegpt(20 * (i + 1), 3 * (i + 1))) + "\n" for i in range(5)))
    spec = RampSpec(levels=[2], prompts_file=f, requests_per_level=10, step_seconds=60)
    prof = read_profile(os.path.join(os.path.dirname(__file__), "..", "..", "profiles",
                                     "sim-demo-8x-rtx-4090-llama-3-70b-awq.yaml"))
    sp = ma.plan_rig(prof.server_config(), "RTX 4090", 8)
    res = predict_ramp(ma.StepModel(sp).model, EngineLimits(sp.num_blocks, sp.max_num_seqs, sp.max_num_batched_tokens),
                       spec)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in res.records}
    assert pairs and pairs <= {(20 * (i + 1), 3 * (i + 1)) for i in range(5)}


def test_histograms_before_the_run_in_the_cli_text(tmp_path):
    from app.cli.ramp import dataset_text

    h = dataset_lengths(RampSpec(levels=[1], prompts_file="builtin:chat"))
    assert h["entries"] == 1000 and h["format"] == "builtin" and h["prompt"]["n"] == 2000
    assert sum(h["prompt"]["counts"]) == 2000 and len(h["output"]["edges"]) == len(h["output"]["counts"]) + 1
    assert h["prompt"]["p50"] <= h["prompt"]["p90"] <= h["prompt"]["max"] <= 1024
    text = dataset_text(RampSpec(levels=[1], prompts_file="builtin:chat"))
    assert "dataset builtin:chat: 1000 entries" in text and "prompt tokens: mean 1" in text and "│█" in text
    assert dataset_lengths(RampSpec(levels=[1])) is None


def test_cli_output_tokens_caps_a_datasets_answers_and_a_bad_file_exits_2(tmp_path):
    from app.cli import build_parser
    from app.cli.ramp import spec_from_args
    from tests.unit.test_cli_args import run_cli

    f = tmp_path / "sg.json"
    f.write_text(json.dumps([sharegpt(4, 40)]))
    base = ["ramp", "--url", "http://127.0.0.1:9", "--levels", "1", "--prompts-file", str(f)]
    a = build_parser().parse_args(base)
    spec = spec_from_args(a)
    assert spec.output_cap is None and spec.output_tokens == 128 and LengthSampler.of(spec).next() == (4, 40)
    spec = spec_from_args(build_parser().parse_args([*base, "--output-tokens", "16"]))
    assert spec.output_cap == 16 and LengthSampler.of(spec).next() == (4, 16)
    assert spec_from_args(build_parser().parse_args(["ramp", "--levels", "1", "--output-tokens", "16"])).output_cap is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\nnot json\n')
    code, out, err = run_cli(["ramp", "--url", "http://127.0.0.1:9", "--levels", "1", "--prompts-file", str(bad)])
    assert code == 2 and "--prompts-file: prompts_file" in err and "bad.jsonl line 2: not JSON" in err
    code, out, err = run_cli(["ramp", "--url", "http://127.0.0.1:9", "--levels", "1", "--prompts-file", str(f),
                              "--prompts-format", "csv"])
    assert code == 2 and "Traceback" not in err


def test_the_json_export_and_the_run_store_keep_the_histograms(tmp_path, dyno_home):
    from app.loadgen.export import to_json
    from app.loadgen.generator import RampResult
    from app.run.record import RunRecorder
    from app.store import RunStore

    spec = RampSpec(levels=[1], prompts_file="builtin:chat")
    res = RampResult(status="done")
    lengths = to_json(res, spec)["summary"]["lengths"]
    assert lengths["entries"] == 1000 and lengths["prompt"]["counts"] and lengths["output"]["p90"] > 0
    assert to_json(res, RampSpec(levels=[1]))["summary"]["lengths"] is None
    with RunStore() as store:
        rec = RunRecorder(store, name="t", engine="attach", profile_data=None, spec=spec.model_dump(mode="json"))
        rec.set_context(lengths=dataset_lengths(spec))
        rec.finish("done")
        assert store.get_run(rec.run_id)["config"]["lengths"] == json.loads(json.dumps(lengths))


def test_the_plans_workload_carries_the_dataset(tmp_path):
    """The plan of a dataset ramp (app.planner.plan.Workload.from_ramp) predicts with the
    dataset: its ramp and search specs keep the prompts file, and its lengths for the KV
    cache's concurrency are the dataset requests' means."""
    from app.planner.plan import Workload

    f = tmp_path / "sg.jsonl"
    f.write_text("".join(json.dumps(sharegpt(p, o)) + "\n" for p, o in ((10, 100), (30, 300))))
    spec = RampSpec(levels=[1, 2], prompts_file=f, output_cap=200, slo={"ttft_p99": 1.0})
    w = Workload.from_ramp(spec)
    assert (w.prompt_tokens, w.output_tokens) == (20, 150)
    for s in (w.ramp_spec([1, 2]), w.search_spec()):
        assert str(s.prompts_file) == str(f) and s.output_cap == 200
        assert sorted(planned_lengths(s, 2)) == [(10, 100), (30, 200)]


def test_a_dataset_request_is_cut_to_the_servers_context():
    """The runner passes /v1/models' max_model_len: a long-tail request's max_tokens is cut
    so the prompt (estimate + 10 % + 16) and output fit; the others are sent as drawn."""
    from app.loadgen.prompts import fit_context

    assert fit_context(100, 50, 2048) == 50
    assert fit_context(1000, 1048, 2048) == 2048 - 1100 - 16
    assert fit_context(3000, 10, 2048) == 1  # the prompt alone is too long: the server says so
    spec = RampSpec(levels=[1], prompts_file="builtin:chat")
    fac = RequestFactory(spec, "m", max_model_len=512)
    for _ in range(300):
        _, est, mx = fac.next()
        assert mx == 1 or est * 1.1 + 16 + mx <= 512 + 1


def test_a_byte_order_mark_is_skipped(tmp_path):
    f = tmp_path / "bom.json"
    f.write_bytes("\ufeff".encode() + json.dumps([sharegpt(3, 4)]).encode())
    g = tmp_path / "bom.jsonl"
    g.write_bytes("\ufeff".encode() + b'{"prompt": "a b"}\n')
    assert load_dataset(f).entries[0].answer_tokens == 4 and load_dataset(g).entries[0].prompt == "a b"


def test_plan_run_and_tune_take_the_dataset_options_as_ramp_does():
    """One set of workload options (app.cli.common.add_workload_options) on ramp, run,
    plan and tune: the plan and the tune predict with the dataset's requests and their
    mean lengths (builtin:chat: ShareGPT's means, ≈ 153 in / 331 out), a bad dataset is an
    error naming --prompts-file."""
    from app.cli import build_parser
    from app.cli.plan import workload_from_args
    from app.cli.tune import spec_from_args as tune_spec

    p = build_parser()
    wl = workload_from_args(p.parse_args(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090",
                                          "--prompts-file", "builtin:chat"]))
    assert str(wl.requests.prompts_file) == "builtin:chat"
    assert 120 < wl.prompt_tokens < 190 and 280 < wl.output_tokens < 380, (wl.prompt_tokens, wl.output_tokens)
    assert wl.search_spec() is None and str(wl.ramp_spec([1]).prompts_file) == "builtin:chat"
    ts = tune_spec(p.parse_args(["tune", "--engine", "sim", "--sim-gpu", "RTX 4090", "--sim-gpu-count", "2",
                                 "--model", "Llama-3-8B", "--slo-ttft-p99", "2", "--prompts-file", "builtin:chat"]))
    assert str(ts.prompts_file) == "builtin:chat"
    assert str(ts.workload().search_spec().prompts_file) == "builtin:chat"  # measured with the dataset too
    with pytest.raises(ValueError, match="--prompts-file"):
        workload_from_args(p.parse_args(["plan", "--model", "Llama-3-8B", "--gpu", "RTX 4090",
                                         "--prompts-file", "builtin:nope"]))
