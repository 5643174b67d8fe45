"""The raise-site table (issue 36 item 1): every ``raise X(...)``, ``assert …, msg`` and
``logger.error`` with a message in the files of vLLM a launch can end in, with its
wording, the diagnosis' kind for it, whether the plan predicts that kind, the fix, and
whether a user can reach it from ``vllm serve`` flags, a model directory or the machine.
Library errors a launch commonly ends with (transformers, OS errors, torch, inductor,
Triton, huggingface_hub) are appended from :data:`LIBRARY_SITES`.

The wording is the message template: f-string parts and ``%`` / ``.format`` arguments
become ``{placeholders}``; a message built in a variable is followed to its assignment in
the same function. The kind is what :func:`app.planner.diagnose.diagnose` says of the
template filled in (placeholders as numbers first, then as words); "covered" means a
unit test feeds that site's wording (tests/unit/test_diagnose_env.py ``SITE_WORDINGS``,
checked by tests/unit/test_raise_sites.py). Re-raises and raises without a message are
counted but not listed.

Usage (the CPU build's interpreter is not needed; any Python 3.11 with this checkout's
.venv): ``.venv/bin/python scripts/vllm_raise_sites.py [--vllm DIR] [--out FILE]``;
``--counts`` only prints the counts; ``--checkout DIR`` counts with another checkout's
diagnosis (the "before" figure: a worktree of an older commit). Writes docs/vllm-raise-sites.md.
"""
from __future__ import annotations

import argparse
import ast
import glob
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

VERSION = "0.32.0"
#: the files issue 36 lists, relative to the vllm package (globs; a directory is walked)
FILES = ("engine/arg_utils.py", "config/*.py", "v1/core/kv_cache_utils.py", "v1/worker/*_worker.py",
         "model_executor/model_loader", "model_executor/layers/quantization", "platforms",
         "entrypoints/cli/serve.py", "entrypoints/openai/api_server.py", "entrypoints/launchers/api_server",
         "entrypoints/launchers/launcher.py", "entrypoints/launchers/cli_args.py")

#: (source, wording, reachable reason) of library errors a launch commonly ends with
LIBRARY_SITES = [
    ("transformers/dynamic_module_utils.py resolve_trust_remote_code, 5.19.0",
     "The repository {model_name} contains custom code which must be executed to correctly load the model."),
    ("transformers/dynamic_module_utils.py resolve_trust_remote_code, 5.19.0",
     "The repository {model_name} references custom code contained in {upstream_repo} which must be executed to "
     "correctly load the model."),
    ("transformers/tokenization_utils_base.py from_pretrained, 5.19.0",
     "Can't load tokenizer for '{pretrained_model_name_or_path}'. If you were trying to load it from "
     "'https://huggingface.co/models', make sure you don't have a local directory with the same name."),
    ("transformers/tokenization_utils_tokenizers.py, 5.19.0",
     "Couldn't instantiate the backend tokenizer from one of: "),
    ("transformers/utils/import_utils.py SENTENCEPIECE_IMPORT_ERROR, 5.19.0",
     "{0} requires the SentencePiece library but it was not found in your environment."),
    ("transformers/configuration_utils.py, 5.19.0", "It looks like the config file at '{path}.gguf' is not a valid "
                                                    "JSON file."),
    ("vllm/tokenizers/hf.py get_tokenizer, 0.32.0",
     "Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available in the HuggingFace "
     "transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` "
     "flag in the CLI."),
    ("vllm/transformers_utils/config.py HFConfigParser.parse, 0.32.0",
     "Failed to load the model config. If the model is a custom model not yet available in the HuggingFace "
     "transformers library, consider setting `trust_remote_code=True` in LLM or using the `--trust-remote-code` "
     "flag in the CLI."),
    ("vllm/transformers_utils/config.py get_config, 0.32.0",
     "Invalid repository ID or local directory specified: '{model}'."),
    ("OS error ENOSPC (errno 28)", "[Errno 28] No space left on device: '{path}'"),
    ("OS error EACCES (errno 13)", "[Errno 13] Permission denied: '{path}'"),
    ("OS error EADDRINUSE (errno 98)", "[Errno 98] Address already in use"),
    ("huggingface_hub/file_download.py _check_disk_space, 2.4.0",
     "Not enough free disk space to download the file. The expected file size is: {size} MB. The target location "
     "{target_dir} only has {free} MB free disk space."),
    ("torch c10/cuda/CUDACachingAllocator.cpp, 2.13.0",
     "CUDA out of memory. Tried to allocate {x} GiB. GPU {d} has a total capacity of {t} GiB of which {f} GiB is "
     "free."),
    ("torch/_inductor/exc.py InvalidCxxCompiler, 2.13.0",
     "No working C++ compiler found in torch._inductor.config.cpp.cxx: {cxx}"),
    ("triton/runtime/build.py, 3.9.0",
     "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."),
    ("vllm/v1/worker/gpu_worker.py determine_available_memory (assert), 0.32.0",
     "Error in memory profiling. Initial free memory {init} GiB, current free memory {now} GiB."),
]

#: platforms vLLM Dyno does not run (it plans NVIDIA cards and the CPU build)
_OTHER_PLATFORM = re.compile(r"(?:^|/)(?:rocm|tpu|xpu|zen_cpu|hpu|neuron|ipex|quark|aiter|gaudi)[^/]*(?:/|\.py$)|"
                             r"/rocm|_rocm|xpu_|/tpu|/ipex")
#: sites reviewed by hand (vLLM 0.32.0) that no `vllm serve` flag, model directory or machine reaches:
#: (pattern, reason); a pattern that starts with "(?:^|/)" is matched against the path, the others
#: against the wording
_UNREACHABLE: list[tuple[re.Pattern[str], str]] = [(re.compile(rx), why) for rx, why in (
    (r"(?:^|/)model_executor/model_loader/weight_cache/",
     "the weight-cache daemon (`vllm preload`, CUDA IPC between processes): a separate process vLLM Dyno does not "
     "start"),
    (r"(?:^|/)[\w/]*_test\.py$", "vLLM's own test helpers, not imported by a launch"),
    (r"(?:^|/)entrypoints/launchers/api_server/entry\.py",
     "the API server's own exit on a signal, not a launch failure"),
    (r"(?:^|/)config/utils\.py",
     "config helpers (hashing, dataclass introspection, the worker's update_config RPC): the Python API, not a "
     "launch's flags"),
    (r"\bAITER\b|VLLM_XPU|VLLM_ROCM|ROCm DeepEP",
     "ROCm/XPU-only kernels or options: vLLM Dyno plans NVIDIA cards and the CPU build"),
    (r"platform plugin|No attribute named|is not a dataclass|not a class\b|has no recognized attributes",
     "an out-of-tree platform plugin or Python attribute lookup, not a flag"),
    (r"free_block|free_list|popleft\(\)|No free blocks available|Invalid index type|values must be non-empty|"
     r"values must be positive, got|one value per expert|Must have same (?:input|scheme|location)|expert index",
     "the KV block pool's or a kernel helper's internal state"),
    (r"weight update|Weight transfer|trainer connection|without a matching|called with conflicting|"
     r"Draft model weight|sleep retention|Config override '|must be a subclass of|expected a callable|Expected values to be a list|"
     r"cannot be converted to|All options must be of the same type|Unsupported type \{type_hints\}",
     "the RL weight-transfer RPC, sleep mode's or the argument parser's Python API, not a `vllm serve` launch"),
    (r"NVLink detection|Error accepting a connection|Original file '%s' not modified",
     "logged by vLLM, which goes on: not an error a launch ends with"),
    (r"_api_process_rank|must be set after applying|has not been resolved yet|No compilation mode is set|"
     r"is an override but is has not been added|Failed to promote local KV cache specs|Message size",
     "an order-of-initialization check inside vLLM, not reachable from flags"),
)]
_INTERNAL = re.compile(r"should not|should never|\bbug\b|internal|unreachable|not initialized|must be called|"
                       r"Unexpected|unexpected|already|not yet implemented|TODO|\bLLM\(|LLM class|Python API|"
                       r"offline|engine_args|weight_loader|loaded_weight|shard_id|param\.|\bparam\b|tensor\b|"
                       r"Tensor|dtype of|shape", re.I)


@dataclass
class Site:
    path: str  # relative to site-packages: vllm/…
    line: int
    exc: str
    wording: str
    kind: str | None = None
    fix: str = ""
    predicts: bool = False
    reachable: bool = True
    why: str = ""
    covered: bool = False
    sample: str = ""  # the filled wording the kind was found with

    @property
    def key(self) -> str:
        """``file:line`` of a vLLM site; ``library N: source`` of a library error."""
        return f"{self.path}:{self.line}" if self.line > 0 else f"library {-self.line}: {self.path}"


def _template(node: ast.AST, fn: ast.AST | None, depth: int = 0) -> str | None:
    """The message template of an expression (None when it has no text of its own)."""
    if depth > 4:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                out.append(str(v.value))
            else:
                out.append("{" + ast.unparse(v.value)[:40] + "}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _template(node.left, fn, depth + 1), _template(node.right, fn, depth + 1)
        if a is None and b is None:
            return None
        return (a if a is not None else "{" + ast.unparse(node.left)[:40] + "}") + \
               (b if b is not None else "{" + ast.unparse(node.right)[:40] + "}")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        t = _template(node.left, fn, depth + 1)
        return None if t is None else re.sub(r"%[-#0 +]*\d*(?:\.\d+)?[sdfrxi]", "{}", t)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _template(node.func.value, fn, depth + 1)
    if isinstance(node, ast.Name) and fn is not None:  # a message built in a variable of the same function
        last = None
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                if n.lineno <= node.lineno and (last is None or n.lineno > last.lineno):
                    last = n
        return None if last is None else _template(last.value, fn, depth + 1)
    return None


def site_line(exc: str, wording: str) -> str:
    """The log line a site's wording is diagnosed from: ``ERROR ValueError: <wording>`` as
    vLLM's traceback ends (a library error, or a ``logger.error``, without the class)."""
    return f"ERROR {wording}" if exc == "library" or exc.startswith("logger.") else f"ERROR {exc}: {wording}"


def _functions(tree: ast.AST) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def scan(vllm: Path) -> tuple[list[Site], int]:
    """The sites of :data:`FILES` under ``vllm`` (the package directory), and how many
    raises had no message (re-raises, bare exceptions)."""
    paths: list[Path] = []
    for pat in FILES:
        for p in sorted(glob.glob(str(vllm / pat))):
            pp = Path(p)
            paths += sorted(pp.rglob("*.py")) if pp.is_dir() else [pp]
    sites, silent = [], 0
    for p in dict.fromkeys(paths):
        rel = "vllm/" + str(p.relative_to(vllm))
        tree = ast.parse(p.read_text(), str(p))
        owner: dict[int, ast.AST] = {}
        for fn in _functions(tree):
            for n in ast.walk(fn):
                if hasattr(n, "lineno"):
                    owner.setdefault(id(n), fn)
        for fn in sorted(_functions(tree), key=lambda f: -f.lineno):  # innermost wins
            for n in ast.walk(fn):
                owner[id(n)] = fn if id(n) not in owner or owner[id(n)].lineno < fn.lineno else owner[id(n)]
        for n in ast.walk(tree):
            exc, msg = None, None
            if isinstance(n, ast.Raise):
                if not isinstance(n.exc, ast.Call):
                    silent += 1
                    continue
                exc = ast.unparse(n.exc.func).split(".")[-1]
                arg = n.exc.args[0] if n.exc.args else next((k.value for k in n.exc.keywords if k.arg in ("msg", "message")), None)
                msg = None if arg is None else _template(arg, owner.get(id(n)))
            elif isinstance(n, ast.Assert) and n.msg is not None:
                exc, msg = "AssertionError", _template(n.msg, owner.get(id(n)))
            elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("error", "exception")
                  and isinstance(n.func.value, ast.Name) and n.func.value.id == "logger" and n.args):
                exc, msg = "logger." + n.func.attr, _template(n.args[0], owner.get(id(n)))
            else:
                continue
            if not msg or not msg.strip() or re.fullmatch(r"\s*\{[^}]*\}\s*", msg):
                silent += 1
                continue
            sites.append(Site(rel, n.lineno, exc, " ".join(msg.split())))
    sites.sort(key=lambda s: (s.path, s.line))
    return sites, silent


def _fills(t: str) -> list[str]:
    """The template filled in: placeholders as numbers, as words, as a quoted path."""
    return [re.sub(r"\{[^{}]*\}", v, t) for v in ("8", "x", "/models/m")]


def classify(sites: list[Site], covered: set[str]) -> None:
    """Each site's kind, fix, prediction, reachability and coverage."""
    from app.planner import checks
    from app.planner.diagnose import diagnose
    from app.planner.plan import fix_to_flags

    src = Path(checks.__file__).read_text()
    planned = set(re.findall(r'Finding\(\s*"(\w+)"', src))
    for s in sites:
        for text in _fills(s.wording):
            try:
                d = diagnose([site_line(s.exc, text)])
            except Exception:  # a rule that cannot read this filling: try the next
                d = None
            if d is not None and d.problem not in ("engine_init_failed", "engine_dead", "engine_runtime_error",
                                                   "invalid_config"):
                s.kind, s.sample = d.problem, text
                s.fix = fix_to_flags(d.fix) if d.fix else d.explanation.split(":")[0][:90].strip()
                break
        s.predicts = s.kind in planned
        s.reachable, s.why = _reachable(s)
        s.covered = s.key in covered


def _reachable(s: Site) -> tuple[bool, str]:
    if s.line <= 0:
        return True, "a library error of a launch"
    if _OTHER_PLATFORM.search(s.path):
        return False, "ROCm/TPU/XPU code: vLLM Dyno plans NVIDIA cards and the CPU build"
    if s.kind is not None and not s.kind.startswith("config_"):
        return True, "users report it (the diagnosis has a rule of its own)"
    for rx, why in _UNREACHABLE:
        if rx.search(s.path if rx.pattern.startswith("(?:^|/)") else s.wording):
            return False, why
    if s.exc == "AssertionError":
        return False, "an assert: an internal invariant"
    if s.exc == "NotImplementedError" and not re.search(r"support", s.wording, re.I):
        return False, "an abstract method or unfinished path"
    if _INTERNAL.search(s.wording):
        return False, "an internal state or the Python API, not a flag, a model directory or the machine"
    if s.kind is not None:
        return True, "a check of `vllm serve` options, the model's config or the checkpoint (named by vLLM's phrasing)"
    return True, "from flags, a model directory or the machine (not verified site by site)"


def library_sites() -> list[Site]:
    return [Site(src, -i, "library", w) for i, (src, w) in enumerate(LIBRARY_SITES, 1)]


def counts(sites: list[Site]) -> dict[str, int]:
    reach = [s for s in sites if s.reachable]
    return {"sites": len(sites), "reachable": len(reach), "named": sum(1 for s in reach if s.kind),
            "covered": sum(1 for s in reach if s.covered)}


def _cell(t: str) -> str:
    return t.replace("|", "\\|").replace("\n", " ")


def render(sites: list[Site], silent: int, before: dict[str, int] | None) -> str:
    c = counts(sites)
    pct = 100 * c["covered"] / max(1, c["reachable"])
    out = [f"# Where a vLLM {VERSION} launch ends: the raise-site table",
           "",
           "Generated by `scripts/vllm_raise_sites.py` from the installed CPU build (`.venv-vllm`) and the library "
           "errors it lists; do not edit by hand. Columns: the site (file:line, vLLM "
           f"{VERSION}), the exception, the wording (placeholders in braces), the kind the diagnosis gives "
           "(`app/planner/diagnose.py`), whether a plan check predicts that kind (`app/planner/checks.py`), the "
           "fix the diagnosis gives, whether a user reaches it from `vllm serve` flags, a model directory or the "
           "machine (with the reason), and whether a unit test feeds its wording "
           "(`tests/unit/test_diagnose_env.py` `SITE_WORDINGS`, checked by `tests/unit/test_raise_sites.py`).",
           "",
           "## Counts",
           "",
           f"- sites listed: {c['sites']} ({silent} re-raises and raises without a message not listed)",
           f"- reachable: {c['reachable']}",
           f"- reachable and named by the diagnosis: {c['named']}",
           f"- reachable and covered (a test feeds the wording): {c['covered']} ({pct:.0f} %)"]
    out.append("- before issue 36 (the diagnosis of commit 5905540): reachable and named 32 of 700; no site had a "
               "test keyed to it")
    if before:
        bp = 100 * before["covered"] / max(1, before["reachable"])
        out.append(f"- before the generic config kinds and the reachability review (the table of commit "
                   f"{before['commit']}): reachable {before['reachable']}, covered {before['covered']} ({bp:.0f} %)")
    out += ["", "Reachability is judged by rules (`_reachable` in the script): other platforms' files (ROCm, TPU, "
            "XPU, HPU), asserts and internal-state wordings, and the groups reviewed by hand in `_UNREACHABLE` "
            "(each row gives its reason: the weight-cache daemon, the RL weight-transfer RPC and the Python API, "
            "the KV block pool's internals, order-of-initialization checks, logged-and-continued errors) are "
            "unreachable; every other site stays reachable. Config refusals (a ValueError, TypeError or "
            "NotImplementedError from a config class, the option cross-checks of `arg_utils.py`, a quantization "
            "method's checks of the checkpoint) are named by kind from vLLM's phrasing (`CONFIG_KINDS` in "
            "`app/planner/diagnose.py`: config_not_divisible, config_conflict, config_out_of_range, "
            "config_requires, config_not_supported, config_invalid_value), with the option(s) and vLLM's words, "
            "and the value as the fix where the message gives it.", "",
            "| site | exception | wording | kind | plan predicts | fix | reachable | covered |",
            "|---|---|---|---|---|---|---|---|"]
    for s in sites:
        where = s.key
        out.append(f"| {_cell(where)} | {s.exc} | {_cell(s.wording[:220])} | {s.kind or ''} | "
                   f"{'yes' if s.predicts else 'no'} | {_cell(s.fix)} | "
                   f"{'yes' if s.reachable else 'no'}: {s.why} | {'yes' if s.covered else 'no'} |")
    return "\n".join(out) + "\n"


def wordings_module(sites: list[Site]) -> str:
    """tests/unit/raise_site_wordings.py: each reachable site a rule names and that the
    hand-written ``HAND_SITE_WORDINGS`` lacks, keyed by its site, with its template filled
    in (the filling the kind was found with) and the kind."""
    from tests.unit.test_diagnose_env import HAND_SITE_WORDINGS

    out = ['"""The raise sites of vLLM 0.32.0 (the installed CPU build\'s source, `.venv-vllm`) that the diagnosis',
           "names and tests/unit/test_diagnose_env.py HAND_SITE_WORDINGS does not list: site (file:line, as",
           "docs/vllm-raise-sites.md names it) → (its wording: the site's template with its placeholders filled in, the",
           "kind). Generated by `scripts/vllm_raise_sites.py --wordings tests/unit/raise_site_wordings.py`; do not edit",
           "by hand. tests/unit/test_raise_sites.py feeds each as vLLM's traceback ends (``ValueError: <wording>``) and",
           'checks the kind and the fix of its row."""',
           "from __future__ import annotations", "",
           "GENERATED_SITE_WORDINGS: dict[str, tuple[str, str]] = {"]
    for s in sites:
        if s.kind and s.reachable and s.key not in HAND_SITE_WORDINGS:
            out.append(f"    {s.key!r}:\n        ({s.sample!r}, {s.kind!r}),")
    return "\n".join(out + ["}", ""])


def _covered_keys() -> set[str]:
    from tests.unit.test_diagnose_env import SITE_WORDINGS

    return set(SITE_WORDINGS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = next(iter(sorted(glob.glob(str(ROOT / ".venv-vllm/lib/python3*/site-packages/vllm")))), None)
    ap.add_argument("--vllm", default=default, help="vLLM's package directory (default: .venv-vllm's)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "vllm-raise-sites.md"))
    ap.add_argument("--counts", action="store_true", help="print the counts only")
    ap.add_argument("--checkout", default=str(ROOT), help="the checkout whose diagnosis names the sites")
    ap.add_argument("--before", metavar="R,C,COMMIT", help="the counts before (reachable,covered) and the commit "
                    "whose table gave them, to record")
    ap.add_argument("--wordings", metavar="FILE", help="write the reachable named sites' filled wordings that "
                    "test_diagnose_env.HAND_SITE_WORDINGS lacks as a module (tests/unit/raise_site_wordings.py)")
    a = ap.parse_args(argv)
    sys.path.insert(0, a.checkout)  # before the installed (editable) app, which may be another checkout
    if not a.vllm or not os.path.isdir(a.vllm):
        ap.error(f"--vllm {a.vllm!r}: not vLLM's package directory; build the CPU build (make test sets it up) "
                 "or give --vllm DIR")
    sites, silent = scan(Path(a.vllm))
    sites += library_sites()
    classify(sites, set() if a.counts else _covered_keys())
    if a.wordings:
        Path(a.wordings).write_text(wordings_module(sites))
        print(f"wrote {a.wordings}")
        return 0
    c = counts(sites)
    print(", ".join(f"{k} {v}" for k, v in c.items()), f"(not listed: {silent})")
    if a.counts:
        return 0
    before = None
    if a.before:
        r, n, commit = a.before.split(",")
        before = {"reachable": int(r), "covered": int(n), "commit": commit}
    Path(a.out).write_text(render(sites, silent, before))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
