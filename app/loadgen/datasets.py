"""Datasets for a ramp's requests: the one reader behind ``RampSpec.prompts_file``.

A source is a local file, ``builtin:chat`` (a synthetic chat-like dataset, nothing to
download) or ``hf:OWNER/NAME[/FILE]`` (a dataset already in the Hugging Face hub cache;
never downloaded). Formats (``RampSpec.prompts_format``; None → detected):

- ``sharegpt``: JSON (a list) or JSONL of ``{"conversations": [{"from": "human",
  "value": …}, {"from": "gpt", "value": …}, …]}``: the first human turn is the prompt,
  the turn after it (gpt/assistant/chatgpt/bard/model) the answer — as vLLM's
  ``ShareGPTDataset`` (vllm/benchmarks/datasets/datasets.py in 0.32, line ~1372: turns 0
  and 1 of conversations with at least two) takes the first two turns.
  Conversations without a human turn are skipped (counted in :attr:`Dataset.skipped`);
- ``chat``: OpenAI chat JSONL ``{"messages": [{"role", "content"}, …]}``: a last
  ``assistant`` message is the answer, the messages before it the prompt;
- ``prompt``: ``{"prompt": "…"}`` JSONL, an answer optionally in ``completion``,
  ``response``, ``output`` or ``answer``;
- ``csv``: a header row and a text column (``prompts_column``, or the first of
  :data:`TEXT_COLUMNS`); an answer column is taken from :data:`ANSWER_COLUMNS` when present;
- ``parquet``: likewise (pyarrow); a ``conversations`` or ``messages`` column is read
  as ShareGPT or chat records.

Detection: ``.csv``/``.tsv`` → csv, ``.parquet``/``.pq`` → parquet, otherwise JSON(L),
the record kind from each record's keys (a given format: every record must be one).

Lengths, in tokens, are estimated as the synthetic prompts are counted: one token a
whitespace-separated word (:func:`estimate_tokens`); a chat prompt counts the words of
its messages' text. A ramp's ``max_tokens`` is the answer's length (:func:`output_of`).

Bounds (a dataset may be gigabytes): at most :data:`MAX_ENTRIES` entries and
:data:`MAX_BYTES` of a JSON/JSONL/CSV file are read, streamed (a JSON list is decoded
item by item with :meth:`json.JSONDecoder.raw_decode`, never loaded whole); Parquet is
read in record batches of the needed columns up to :data:`MAX_ENTRIES` rows. A dataset
cut at a bound says so (:attr:`Dataset.truncated`). Loaded datasets are cached by path,
size and modification time.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal, Optional, get_args

from app.paths import hf_cache_dirs

#: a dataset file's format (``--prompts-format``)
DatasetFormat = Literal["sharegpt", "chat", "prompt", "csv", "parquet"]
FORMATS: tuple[DatasetFormat, ...] = get_args(DatasetFormat)
#: the most entries read from a dataset (a ramp sends far fewer; 20,000 draws give its
#: length distribution's percentiles to about 1 %)
MAX_ENTRIES = 20_000
#: the most read from a JSON/JSONL/CSV file (64 Mi characters of its text, about 64 MiB)
MAX_BYTES = 64 << 20
#: text columns detected in CSV/Parquet, in this order (case-insensitive)
TEXT_COLUMNS = ("prompt", "text", "question", "instruction", "input")
#: answer columns detected in CSV/Parquet and answer keys of ``{"prompt": …}`` records
ANSWER_COLUMNS = ("completion", "response", "output", "answer")
#: ShareGPT speakers of the prompt and of the answer (ShareGPT_V3: human/gpt; others use these too)
HUMAN = ("human", "user")
BOT = ("gpt", "assistant", "chatgpt", "bard", "model", "bing")

BUILTIN = "builtin:"
HF = "hf:"
#: data files looked for in a Hugging Face dataset snapshot
DATA_EXTS = (".json", ".jsonl", ".csv", ".parquet")


class DatasetError(ValueError):
    """A dataset that cannot be read: the message names the source, the line or row and the fix."""


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` as the load generator estimates them: its whitespace-separated
    words, at least 1 (the synthetic prompts' words are one token each)."""
    return max(1, len(text.split()))


def message_text(messages: list) -> str:
    """The text of OpenAI chat messages: each ``content`` string, or the ``text`` of its
    ``{"type": "text"}`` parts, joined by spaces."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out += [str(p.get("text", "")) for p in c if isinstance(p, dict)]
    return " ".join(out)


@dataclass(frozen=True)
class Entry:
    """One request of a dataset. ``prompt``: a string, a list of chat messages, or None
    for a synthetic prompt of ``prompt_tokens`` (built-in datasets: words drawn as the
    synthetic prompts are, scaled by the measured tokens per word); ``prompt_tokens``:
    its estimated length; ``answer_tokens``: the answer's estimated length (None: the
    dataset has no answer for it)."""

    prompt: object
    prompt_tokens: int
    answer_tokens: Optional[int]


@dataclass(frozen=True)
class Dataset:
    """A loaded dataset: ``source`` as given, ``format`` as read, ``entries`` (at least
    one), ``skipped`` records without a prompt, ``truncated`` when a bound of the module
    docstring cut it."""

    source: str
    format: str
    entries: tuple[Entry, ...]
    skipped: int = 0
    truncated: bool = False
    note: str = field(default="")

    @property
    def synthetic(self) -> bool:
        """Its prompts are made of synthetic words (the runner measures tokens per word)."""
        return any(e.prompt is None for e in self.entries)

    @property
    def has_answers(self) -> bool:
        return any(e.answer_tokens is not None for e in self.entries)


# ---------------------------------------------------------------------------- records → entries
def _where(path: object, where: str) -> str:
    return f"prompts_file {path} {where}".rstrip()


def _sharegpt(obj: dict, src: object, where: str) -> Entry | None:
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise DatasetError(f"{_where(src, where)}: \"conversations\" must be a list of "
                           "{\"from\": \"human\"|\"gpt\", \"value\": \"…\"} turns")
    for i, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or "from" not in turn:
            raise DatasetError(f"{_where(src, where)}: turn {i + 1} of \"conversations\" must be "
                               "{\"from\": \"human\"|\"gpt\", \"value\": \"…\"}")
    for i, turn in enumerate(conv):
        if str(turn["from"]).lower() in HUMAN and turn["value"].strip():
            answer = None
            if i + 1 < len(conv) and str(conv[i + 1]["from"]).lower() in BOT:
                answer = estimate_tokens(conv[i + 1]["value"])
            return Entry(turn["value"], estimate_tokens(turn["value"]), answer)
    return None


def _chat(obj: dict, src: object, where: str) -> Entry | None:
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m for m in msgs):
        raise DatasetError(f"{_where(src, where)}: \"messages\" must be a list of "
                           "{\"role\": \"user\"|\"assistant\"|…, \"content\": \"…\"}")
    answer = None
    if len(msgs) > 1 and msgs[-1].get("role") == "assistant":
        answer = estimate_tokens(message_text(msgs[-1:]))
        msgs = msgs[:-1]
    if not msgs:
        return None
    return Entry(msgs, estimate_tokens(message_text(msgs)), answer)


def _prompt(obj: dict, src: object, where: str) -> Entry | None:
    p = obj.get("prompt")
    if not isinstance(p, str):
        raise DatasetError(f"{_where(src, where)}: \"prompt\" must be a string: write {{\"prompt\": \"…\"}}")
    answer = next((obj[k] for k in ANSWER_COLUMNS if isinstance(obj.get(k), str)), None)
    return Entry(p, estimate_tokens(p), estimate_tokens(answer) if answer is not None else None)


_KINDS = {"sharegpt": ("conversations", _sharegpt), "chat": ("messages", _chat), "prompt": ("prompt", _prompt)}


def _record_kind(obj: object, fmt: str | None, src: object, where: str) -> str:
    """The record kind of a JSON record: ``fmt`` when given (the record must be one), else by its keys."""
    if not isinstance(obj, dict):
        raise DatasetError(f"{_where(src, where)}: not a JSON object: write one record a line, e.g. "
                           "{\"prompt\": \"…\"}, {\"messages\": […]} or {\"conversations\": […]}")
    if fmt is not None:
        key = _KINDS[fmt][0]
        if key not in obj:
            found = ", ".join(sorted(obj)[:5]) or "no keys"
            raise DatasetError(f"{_where(src, where)}: not a {fmt} record (no \"{key}\"; it has {found}): "
                               f"fix the record or give the file's format with --prompts-format")
        return fmt
    for kind, (key, _) in _KINDS.items():
        if key in obj:
            return kind
    found = ", ".join(sorted(obj)[:5]) or "no keys"
    raise DatasetError(f"{_where(src, where)}: no \"conversations\", \"messages\" or \"prompt\" (it has {found}): "
                       "write ShareGPT, OpenAI chat or {\"prompt\": …} records")


# ---------------------------------------------------------------------------- JSON / JSONL
def _json_records(path: Path, budget: list[int]) -> Iterator[tuple[str, object]]:
    """``(where, record)`` of a JSON list (``item N``) or JSONL file (``line N``), streamed;
    stops when ``budget[0]`` bytes were read (sets it to -1)."""
    with path.open("r", encoding="utf-8-sig", errors="strict") as f:  # -sig: a byte-order mark is skipped
        head = f.read(1)
        while head and head.isspace():
            head = f.read(1)
        f.seek(0)
        if head == "[":
            yield from _json_list(f, path, budget)
            return
        for i, line in enumerate(f, 1):
            budget[0] -= len(line)
            if budget[0] < 0:
                return
            if not line.strip():
                continue
            try:
                yield f"line {i}", json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"prompts_file {path} line {i}: not JSON ({e.msg}): one JSON object a line "
                                   "(JSONL), or one JSON list for the whole file") from None


def _json_list(f: io.TextIOBase, path: Path, budget: list[int]) -> Iterator[tuple[str, object]]:
    """The items of a top-level JSON list, decoded one at a time with the standard
    decoder's ``raw_decode`` from a sliding buffer (never the whole file in memory)."""
    dec = json.JSONDecoder()
    buf = f.read(1 << 16)
    budget[0] -= len(buf)
    pos = buf.index("[") + 1
    n = 0
    eof = False
    while True:
        while True:  # skip blanks and the comma between items
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos < len(buf) or eof:
                break
            buf, pos = f.read(1 << 16), 0
            budget[0] -= len(buf)
            eof = not buf
        if pos >= len(buf) or buf[pos] == "]":
            return
        while True:
            try:
                obj, end = dec.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as e:
                if eof or budget[0] < 0:
                    if budget[0] < 0:
                        return
                    raise DatasetError(f"prompts_file {path} item {n + 1}: not JSON ({e.msg}): "
                                       "the file must be one JSON list of records") from None
                more = f.read(1 << 20)
                budget[0] -= len(more)
                eof = not more
                buf, pos = buf[pos:] + more, 0
        n += 1
        yield f"item {n}", obj
        pos = end
        if budget[0] < 0:
            return


def _read_json(path: Path, fmt: str | None) -> Dataset:
    budget = [MAX_BYTES]
    entries: list[Entry] = []
    skipped = 0
    truncated = False
    kinds: list[str] = []
    for where, obj in _json_records(path, budget):
        kind = _record_kind(obj, fmt, path, where)  # detected per record: {"prompt"} and {"messages"} lines may mix
        assert isinstance(obj, dict)  # _record_kind refuses anything else
        if kind not in kinds:
            kinds.append(kind)
        e = _KINDS[kind][1](obj, path, where)
        if e is None:
            skipped += 1
            continue
        entries.append(e)
        if len(entries) >= MAX_ENTRIES:
            truncated = True
            break
    truncated = truncated or budget[0] < 0
    return _done(str(path), "+".join(kinds) or fmt or "prompt", entries, skipped, truncated)


# ---------------------------------------------------------------------------- CSV / Parquet
def _pick(columns: list[str], column: str | None, src: object, what: str) -> tuple[str, str | None]:
    """(text column, answer column or None) among ``columns``."""
    low = {c.lower(): c for c in columns}
    if column is not None:
        if column not in columns and column.lower() not in low:
            raise DatasetError(f"prompts_file {src}: no column {column!r} in the {what} (columns: "
                               f"{', '.join(columns[:12])}): give one of them with --prompts-column")
        text = column if column in columns else low[column.lower()]
    else:
        found = next((low[c] for c in TEXT_COLUMNS if c in low), None)
        if found is None:
            raise DatasetError(f"prompts_file {src}: no text column ({'/'.join(TEXT_COLUMNS)}) in the {what} "
                               f"(columns: {', '.join(columns[:12])}): name it with --prompts-column")
        text = found
    answer = next((low[c] for c in ANSWER_COLUMNS if c in low and low[c] != text), None)
    return text, answer


def _read_csv(path: Path, column: str | None) -> Dataset:
    csv.field_size_limit(MAX_BYTES)  # a prompt may be longer than the module's 128 KiB default
    entries: list[Entry] = []
    truncated = False
    with path.open(newline="", encoding="utf-8-sig") as f:
        sample = f.read(1 << 14)
        f.seek(0)
        try:
            dialect = csv.Sniffer().sniff(sample, delimiters=",;\t|") if sample else csv.excel
        except csv.Error:
            dialect = csv.excel
        reader = csv.DictReader(f, dialect=dialect)
        try:
            cols = list(reader.fieldnames or [])
            if not cols:
                raise DatasetError(f"prompts_file {path}: empty CSV: write a header row and one prompt a row")
            text, answer = _pick(cols, column, path, "CSV header")
            read = 0
            for row in reader:
                read += sum(len(v) for v in row.values() if isinstance(v, str))
                if read > MAX_BYTES:
                    truncated = True
                    break
                cell = row.get(text)
                if cell is None or not cell.strip():
                    raise DatasetError(f"prompts_file {path} line {reader.line_num}: the {text!r} cell is empty: "
                                       "fill it or remove the row")
                a = row.get(answer) if answer else None
                entries.append(Entry(cell, estimate_tokens(cell), estimate_tokens(a) if a and a.strip() else None))
                if len(entries) >= MAX_ENTRIES:
                    truncated = True
                    break
        except csv.Error as e:
            raise DatasetError(f"prompts_file {path} line {reader.line_num}: not CSV ({e}): "
                               "fix the quoting of that row") from None
        except UnicodeDecodeError as e:
            raise DatasetError(f"prompts_file {path}: not UTF-8 text ({e.reason} at byte {e.start}): "
                               "save the CSV as UTF-8") from None
    return _done(str(path), "csv", entries, 0, truncated)


def _read_parquet(path: Path, column: str | None) -> Dataset:
    try:
        # deferred: pyarrow is large (~100 ms to import) and only Parquet datasets need it
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"prompts_file {path}: reading Parquet needs pyarrow: pip install pyarrow "
                           "(or convert the file to JSONL or CSV)") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError for a file that is not Parquet
        raise DatasetError(f"prompts_file {path}: not a Parquet file ({e}): give a .parquet file "
                           "or name the format with --prompts-format") from None
    cols = list(pf.schema_arrow.names)
    kind = next((k for k in ("sharegpt", "chat") if _KINDS[k][0] in cols and column is None), None)
    if kind is not None:
        want = [_KINDS[kind][0]]
    else:
        text, answer = _pick(cols, column, path, "Parquet columns")
        want = [text] + ([answer] if answer else [])
    entries: list[Entry] = []
    skipped = 0
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=want):
        for rec in batch.to_pylist():
            row += 1
            where = f"row {row}"
            if kind is not None:
                entry = _KINDS[kind][1](rec, path, where)
            else:
                cell = rec.get(text)
                if not isinstance(cell, str) or not cell.strip():
                    raise DatasetError(f"prompts_file {path} {where}: the {text!r} value is empty or not text: "
                                       "fill it or remove the row")
                a = rec.get(answer) if answer else None
                entry = Entry(cell, estimate_tokens(cell),
                              estimate_tokens(a) if isinstance(a, str) and a.strip() else None)
            if entry is None:
                skipped += 1
                continue
            entries.append(entry)
            if len(entries) >= MAX_ENTRIES:
                return _done(str(path), "parquet", entries, skipped, True)
    return _done(str(path), "parquet", entries, skipped, False)


def _done(src: str, fmt: str, entries: list[Entry], skipped: int, truncated: bool) -> Dataset:
    if not entries:
        why = f" ({skipped} records without a prompt)" if skipped else ""
        raise DatasetError(f"prompts_file {src}: no prompts in it{why}")
    note = f"the first {len(entries)} entries (bound {MAX_ENTRIES} entries / {MAX_BYTES >> 20} MiB)" if truncated else ""
    return Dataset(src, fmt, tuple(entries), skipped, truncated, note)


# ---------------------------------------------------------------------------- built-in
#: ShareGPT's mean prompt and output lengths, tokens: Kwon et al., "Efficient Memory
#: Management for Large Language Model Serving with PagedAttention", SOSP 2023
#: (arXiv:2309.06180), §6.1 and Fig. 11: "ShareGPT … mean input 161.31, mean output 337.99"
SHAREGPT_MEAN_PROMPT = 161.31
SHAREGPT_MEAN_OUTPUT = 337.99
#: log-normal shape parameters (σ of ln length): long right tails, as the paper's
#: histograms show (our choice of shape; the paper gives the means)
SIGMA_PROMPT = 1.0
SIGMA_OUTPUT = 0.8
#: vLLM's ShareGPT pruning (vllm/benchmarks/datasets/datasets.py ``is_valid_sequence`` in 0.32;
#: vllm/benchmarks/datasets.py and benchmarks/benchmark_serving.py before: min_len 4,
#: max_prompt_len 1024, max_total_len 2048), applied to the draws by rejection
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048
BUILTIN_SIZE = 1000


def builtin_chat(size: int = BUILTIN_SIZE, seed: int = 0) -> tuple[Entry, ...]:
    """The built-in "chat-like" dataset: ``size`` (prompt, answer) lengths drawn from
    log-normals whose means (before pruning) are ShareGPT's (:data:`SHAREGPT_MEAN_PROMPT`,
    :data:`SHAREGPT_MEAN_OUTPUT`; μ = ln(mean) − σ²/2), pruned as vLLM's benchmark
    prunes ShareGPT (prompt 4–1024, prompt + output ≤ 2048 tokens; rejected draws are
    drawn again). Prompts are synthetic words (``prompt`` None). Fixed by ``seed``
    (0): the ramp's seed samples from it."""
    rng = random.Random(seed)
    mu_p = math.log(SHAREGPT_MEAN_PROMPT) - SIGMA_PROMPT ** 2 / 2
    mu_o = math.log(SHAREGPT_MEAN_OUTPUT) - SIGMA_OUTPUT ** 2 / 2
    out: list[Entry] = []
    while len(out) < size:
        p = round(rng.lognormvariate(mu_p, SIGMA_PROMPT))
        o = round(rng.lognormvariate(mu_o, SIGMA_OUTPUT))
        if MIN_LEN <= p <= MAX_PROMPT_LEN and o >= MIN_LEN and p + o <= MAX_TOTAL_LEN:
            out.append(Entry(None, p, o))
    return tuple(out)


BUILTINS = {"chat": builtin_chat}


# ---------------------------------------------------------------------------- Hugging Face cache
def hf_dataset_file(ref: str) -> Path:
    """The file of ``OWNER/NAME[/PATH]`` in the local Hugging Face hub cache (the
    ``datasets--OWNER--NAME`` folder of HF_HUB_CACHE, HF_HOME/hub or
    ~/.cache/huggingface/hub; the snapshot ``refs/main`` names, else the newest). Without
    PATH the snapshot must hold one data file (:data:`DATA_EXTS`), or a ShareGPT
    ``*.json`` named like ``*ShareGPT*``. Never downloads: raises DatasetError saying how."""
    parts = ref.strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise DatasetError(f"prompts_file hf:{ref}: write hf:OWNER/NAME or hf:OWNER/NAME/FILE")
    repo, sub = "/".join(parts[:2]), "/".join(parts[2:])
    folder = "datasets--" + repo.replace("/", "--")
    how = (f"download it first: huggingface-cli download --repo-type dataset {repo}"
           + (f" {sub}" if sub else "") + " (or give a local file)")
    looked = []
    for base in hf_cache_dirs():
        d = base / folder
        looked.append(str(d))
        snaps = []
        ref_main = d / "refs" / "main"
        if ref_main.is_file():
            snaps.append(d / "snapshots" / ref_main.read_text().strip())
        snaps += sorted((p for p in (d / "snapshots").glob("*") if p.is_dir()),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        for snap in snaps:
            if not snap.is_dir():
                continue
            if sub:
                f = snap / sub
                if f.is_file():
                    return f
                continue
            files = sorted(p for p in snap.rglob("*") if p.is_file() and p.suffix.lower() in DATA_EXTS)
            if len(files) == 1:
                return files[0]
            if len(files) > 1:
                share = [p for p in files if "sharegpt" in p.name.lower() and p.suffix == ".json"]
                if len(share) == 1:
                    return share[0]
                names = ", ".join(str(p.relative_to(snap)) for p in files[:8])
                raise DatasetError(f"prompts_file hf:{ref}: the cached dataset has several data files ({names}): "
                                   f"name one, e.g. hf:{repo}/{files[0].relative_to(snap)}")
    raise DatasetError(f"prompts_file hf:{ref}: not in the Hugging Face cache (looked in {', '.join(looked)}); "
                       f"vLLM Dyno never downloads a dataset: {how}")


# ---------------------------------------------------------------------------- loading
_cache: OrderedDict[tuple, Dataset] = OrderedDict()
_cache_lock = threading.Lock()
CACHE_SIZE = 8


def resolve(source: str | os.PathLike) -> Path | None:
    """The local file of a source (``hf:`` looked up in the cache), or None for a built-in."""
    s = str(source)
    if s.startswith(BUILTIN):
        return None
    if s.startswith(HF):
        return hf_dataset_file(s[len(HF):])
    return Path(s).expanduser()


def load_dataset(source: str | os.PathLike, fmt: str | None = None, column: str | None = None) -> Dataset:
    """Read a dataset (module docstring). ``fmt``: one of :data:`FORMATS` (None:
    detected); ``column``: the CSV/Parquet text column. Raises DatasetError naming the
    source, the line/row/item and the fix."""
    s = str(source)
    if fmt is not None and fmt not in FORMATS:
        raise DatasetError(f"prompts_format {fmt!r}: one of {', '.join(FORMATS)}")
    if s.startswith(BUILTIN):
        name = s[len(BUILTIN):]
        if name not in BUILTINS:
            raise DatasetError(f"prompts_file {s}: no such built-in dataset: one of "
                               + ", ".join(BUILTIN + n for n in BUILTINS))
        key: tuple = (s,)
        with _cache_lock:
            hit = _cache.get(key)
        if hit is None:
            hit = Dataset(s, "builtin", BUILTINS[name]())
        return _keep(key, hit)
    path = resolve(s)
    assert path is not None
    if not path.is_file():
        raise DatasetError(f"prompts_file {path}: no such file" + ("" if not path.exists() else " (a folder)"))
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, fmt, column)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return _keep(key, hit)
    ext = path.suffix.lower()
    kind = fmt or ("csv" if ext in (".csv", ".tsv") else "parquet" if ext in (".parquet", ".pq") else None)
    if column is not None and kind not in ("csv", "parquet"):
        raise DatasetError(f"prompts_column {column!r}: a column is for CSV or Parquet files, not {path.name}")
    try:
        if kind == "csv":
            ds = _read_csv(path, column)
        elif kind == "parquet":
            ds = _read_parquet(path, column)
        else:
            ds = _read_json(path, kind)
    except UnicodeDecodeError as e:
        raise DatasetError(f"prompts_file {path}: not UTF-8 text ({e.reason} at byte {e.start}): "
                           "a JSON/JSONL dataset is UTF-8 text (a Parquet file: give --prompts-format parquet)") from None
    except OSError as e:
        raise DatasetError(f"prompts_file {path}: cannot read it ({e.strerror or e})") from None
    return _keep(key, ds)


def _keep(key: tuple, ds: Dataset) -> Dataset:
    with _cache_lock:
        _cache[key] = ds
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return ds


def output_of(entry: Entry, cap: int | None) -> int | None:
    """``max_tokens`` of a dataset entry: the answer's length, at most ``cap`` (tokens;
    None: uncapped); None when the entry has no answer (the ramp's ``output_tokens``
    rule then draws it)."""
    if entry.answer_tokens is None:
        return None
    return max(1, min(entry.answer_tokens, cap) if cap is not None else entry.answer_tokens)


# ---------------------------------------------------------------------------- histograms
def _summary(values: list[int], bins: int) -> dict:
    """``{"n", "mean", "p50", "p90", "max", "edges", "counts"}`` of token lengths: nearest-
    rank percentiles, ``bins`` equal-width bins from 0 to the max (``edges``: bins + 1)."""
    v = sorted(values)
    n = len(v)

    def pct(q: float) -> int:
        return v[min(n - 1, max(0, math.ceil(q * n) - 1))]

    top = max(1, v[-1])
    width = max(1, math.ceil(top / bins))
    edges = [i * width for i in range(bins + 1)]
    counts = [0] * bins
    for x in v:
        counts[min(bins - 1, x // width)] += 1
    return {"n": n, "mean": round(sum(v) / n, 2), "p50": pct(0.5), "p90": pct(0.9), "max": v[-1],
            "edges": edges, "counts": counts}


def length_histogram(lengths: list[tuple[int, int]], bins: int = 20) -> dict:
    """The prompt and output length histograms of ``(prompt tokens, max_tokens)`` pairs
    (the requests a ramp will send, :func:`app.loadgen.prompts.planned_lengths`):
    ``{"prompt": summary, "output": summary}``, each :func:`_summary`."""
    return {"prompt": _summary([p for p, _ in lengths], bins), "output": _summary([o for _, o in lengths], bins)}


def summary_text(hist: dict) -> str:
    """Two lines: ``prompt tokens: mean 161, p50 98, p90 344, max 1024`` and the output's."""
    return "\n".join(f"{name} tokens: mean {h['mean']:.0f}, p50 {h['p50']}, p90 {h['p90']}, max {h['max']}"
                     for name, h in (("prompt", hist["prompt"]), ("output", hist["output"])))


def text_histogram(h: dict, width: int = 30, rows: int = 10) -> str:
    """A compact text histogram of one :func:`_summary`: ``rows`` lines ``lo–hi │███ n``
    (the summary's bins merged in groups)."""
    edges, counts = h["edges"], h["counts"]
    k = max(1, math.ceil(len(counts) / rows))
    groups = [(edges[i], edges[min(i + k, len(edges) - 1)], sum(counts[i:i + k])) for i in range(0, len(counts), k)]
    top = max(c for _, _, c in groups) or 1
    lab = max(len(f"{lo}–{hi}") for lo, hi, _ in groups)
    return "\n".join(f"  {f'{lo}–{hi}':>{lab}} │{'█' * round(width * c / top):<{width}} {c}" for lo, hi, c in groups)
