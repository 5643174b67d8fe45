"""The tuning profile: what a user keeps and shares — settings that worked, with evidence.

A profile on disk is YAML (``schema_version`` :data:`SCHEMA_VERSION`)::

    schema_version: 1
    name: 8x RTX 4090 Llama-3-70B AWQ
    description: …
    engine: vllm            # vllm | sim | attach (app.engines: the selectable engines)
    sim: {gpu: RTX 4090, count: 8}          # the virtual rig (engine sim)
    server:                 # exactly a `vllm serve --config` file: long option names
      model: hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4
      tensor-parallel-size: 8
    env: {NCCL_P2P_DISABLE: "1"}
    gpus: 8                 # first N cards, or a list of indices [0, 1, 2, 3]; absent = all
    ramp: {max_level: 64, step_seconds: 20, slo: {ttft_p99: 2.0}}   # RampSpec (incl. SLO), no url
    hosts: [{ssh: dyno@10.0.0.11, gpus: [0]}, …]   # a rig of several machines (app.hosts.spec); absent = this one
    ray_address: 10.0.0.50:6379   # with distributed-executor-backend: ray, a running Ray cluster to attach to
    hardware: {gpu: RTX 4090, count: 8, driver: …, vllm_version: …}   # the fingerprint
    results: {…}            # per-level summary of the best or latest run
    notes: free text

The port is never stored (it is chosen at launch): a ``port`` key in ``server:`` is
dropped with a warning. Secrets are never stored either: an ``api-key`` in ``server:``
is refused (use the environment variable ``VLLM_API_KEY``).
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from app.config import ServerConfig, number_parser, option_name
from app.engine.specdecode import check_acceptance
from app.engines import SELECTABLE, Engine, names
from app.hosts.spec import Host, hosts_from, parse_ray_address
from app.profiles.env_policy import expansion_problem, valid_env_name
from app.loadgen.spec import SLO, RampSpec
from app.loadgen.stats import peak_level
from app.paths import repo_root
from app.planner.cards import cards_for
from app.planner.gpus import (AMBIENT_RANGE_C, COOLING, COOLING_RANGE, DEFAULT_AMBIENT_C, UnknownGpuError,
                              cooling_text, link_name, lookup_gpu, rig_layout)

#: the schema written by this version; older files are migrated on load (app.profiles.io)
SCHEMA_VERSION = 1

#: the ramp of a profile that does not say (concurrency 1, 2, 4 … 64, 20 s per level)
DEFAULT_RAMP: dict[str, Any] = {"max_level": 64, "step_seconds": 20.0}

_SLUG_RE = re.compile(r"[^a-z0-9]+")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: every ``${NAME`` reference, nested defaults included (checked, never expanded twice)
_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def slugify(name: str) -> str:
    """File stem for a profile name: ``"8× RTX 4090 (AWQ)"`` → ``"8-rtx-4090-awq"``."""
    s = _SLUG_RE.sub("-", name.lower()).strip("-")
    return s[:80] or "profile"


def variable_problems(text: str) -> list[str]:
    """Why the ``${NAME}`` references in ``text`` may not be expanded (empty: all may);
    the rule is :func:`app.profiles.env_policy.expansion_problem` (issue 15, item 2)."""
    out = []
    for m in _REF_RE.finditer(text):
        why = expansion_problem(m.group(1))
        if why is not None and why not in out:
            out.append(why)
    return out


def expand_vars(text: str) -> str:
    """Expand ``${NAME}`` and ``${NAME:-default}`` from the environment, then ``~``.

    Used for model paths in shared profiles (the CPU built-in's model is
    ``${VLLM_DYNO_TINY_MODEL:-./build/tiny-llama}``). Unset without default → empty.
    Only ``VLLM_DYNO_*`` and the path variables of
    :data:`app.profiles.env_policy.EXPANDABLE_NAMES` are expanded, never a secret-like
    name: anything else raises ValueError naming the variable.
    """
    bad = variable_problems(text)
    if bad:
        raise ValueError("; ".join(bad))
    out = _VAR_RE.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), text)
    return os.path.expanduser(out)


def resolve_model_path(model: str) -> str:
    """The model a launch uses: variables expanded; a relative path (``./x``, ``../x``,
    or an ``a/b`` that exists as a directory) made absolute against the current
    directory, else against the checkout root (app.paths.repo_root). A Hugging Face id
    is returned unchanged."""

    m = expand_vars(model)
    if not m or os.path.isabs(m):
        return m
    local = m.startswith(("./", "../"))
    for base in (os.getcwd(), str(repo_root())):
        cand = os.path.normpath(os.path.join(base, m))
        if os.path.isdir(cand):
            return cand
    if local:
        return os.path.normpath(os.path.join(os.getcwd(), m))
    return m


def _catalog_gpu(text: str) -> str:
    """A card of the GPU catalog (``vllm-dyno plan --list-gpus``), as given."""
    try:
        lookup_gpu(str(text))
    except UnknownGpuError as e:
        raise ValueError(str(e)) from None
    return str(text)


def _link(text: str) -> str | None:
    """A link of the link catalog → its catalog name."""
    return link_name(str(text))


def _checked_acceptance(text: str) -> float:
    try:
        return check_acceptance(text)
    except ValueError as e:  # named by the option (argparse, pydantic): the value and the fix only
        raise ValueError(str(e).removeprefix("--sim-spec-acceptance ")) from None


def _perturb(text: str) -> int:
    try:
        v = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a seed: give a whole number such as 7 (0: none)") from None
    if v < 0:
        raise ValueError(f"{text}: give a seed ≥ 1 (0: no perturbation)")
    return v


def _truth_file(text: str) -> dict:
    """``--sim-truth FILE``: the truth in a YAML file (app.profiles.truth), as its mapping."""
    from app.profiles.truth import load_truth  # deferred: only a rig with a truth reads one

    return load_truth(text).mapping()


def _inline_truth(value: Any) -> dict:
    """A profile's ``sim: {truth: {…}}``: a mapping, validated; never a path."""
    from app.profiles.truth import parse_truth  # deferred: as above

    if not isinstance(value, dict):
        raise ValueError("give the truth inline as a mapping (name, terms, rules; docs/sim-truth.md), never a "
                         "path: a profile carries its truth with it")
    return parse_truth(value).mapping()


@dataclass(frozen=True)
class SimOption:
    """The declaration of one option of the simulated rig, attached to its :class:`SimRig`
    field — the one place it is declared: every front end's ``--sim-…`` option (``serve
    --engine sim``, ``run``, ``tune``: :func:`app.cli.common.add_sim_options`), a profile's
    ``sim:`` key (the field), the form's row (``label``) and the sim server's argv
    (:meth:`SimRig.argv`) are generated from it.

    ``flag``: the sim server's option (app.sim.server), also the front ends'; ``help``: what
    it sets, with its unit and default; ``metavar``; ``parse``: the text a user typed → the
    value, ValueError saying what is wanted (the option's name is added by whoever asks:
    argparse, the profile's loader, the form); ``label``: the form's row (None: not on the
    form, or — GPU and count — on its own row); ``choices``: offered by the form's list."""

    flag: str
    help: str
    metavar: str
    parse: Callable[[str], Any]
    label: str | None = None
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """The argparse destination: ``--sim-ambient-c`` → ``sim_ambient_c``."""
        return self.flag.lstrip("-").replace("-", "_")

    def text(self, value: Any) -> str:
        """``value`` as the sim server's argv writes it (a mapping as JSON)."""
        if isinstance(value, dict):
            return json.dumps(value, separators=(",", ":"))
        return repr(value) if isinstance(value, float) else str(value)


class SimRig(BaseModel):
    """The virtual rig of engine ``sim`` (a profile's ``sim:`` block); each field is one
    option of the rig, declared by its :class:`SimOption` (:data:`SIM_RIG_OPTIONS`).

    ``gpu``: catalog GPU name; ``count``: cards; ``hosts``: the cards sit in that many
    hosts, evenly, joined by ``link`` (a link-catalog name; app.engine.steptime models the
    traffic between them); ``time_scale``: k× faster than the wall clock (the demo, tests; times are the rig's);
    ``seed``: random seed; ``perturb``: the seed of a hidden "true rig" whose step-time
    parameters differ from the planner's (app.sim.perturb; None or 0: none); ``truth``: an
    inline truth mapping, how the rig's cards differ from the model by configuration and
    step (app.profiles.truth, docs/sim-truth.md; never a path);
    ``spec_acceptance``: with a speculative config, the chance each draft token is accepted
    given the one before (app.engine.specdecode; None: its default); ``cooling``: a preset
    or a factor of each card's thermal resistance (:data:`app.planner.gpus.COOLING`; None:
    blower4 up to 4 cards, chassis8 above) and ``ambient_c``: the room's temperature, °C
    (None: 25 °C) — how hot the cards run under load (app.sim.gpus)."""

    model_config = ConfigDict(extra="forbid")
    gpu: Annotated[str, SimOption(
        "--sim-gpu", "GPU catalog name, e.g. 'RTX 4090'", "NAME", _catalog_gpu)] = "RTX 4090"
    count: Annotated[int, Field(ge=1, le=64), SimOption(
        "--sim-gpu-count", "number of GPUs (1-64)", "N",
        number_parser(int, low=1, high=64, what="a number of GPUs", example="8"))] = 8
    hosts: Annotated[Optional[int], Field(ge=1, le=64), SimOption(
        "--sim-hosts", "the cards sit in N hosts (evenly; default 1), joined by --sim-link", "N",
        number_parser(int, low=1, high=64, what="a number of hosts", example="2"))] = None
    link: Annotated[Optional[str], SimOption(
        "--sim-link", "the link between the hosts (10gbe, 25gbe, 100gbe, ib-hdr200, ib-ndr400)", "NAME",
        _link)] = None
    time_scale: Annotated[Optional[float], Field(gt=0, allow_inf_nan=False), SimOption(
        "--sim-time-scale", "run k× faster than the wall clock (a demo, a test); every time shown is the "
        "rig's", "K", number_parser(float, low=0, low_open=True, what="a time scale", example="10"),
        label="Sim speed (×)", choices=("1", "2", "4", "10"))] = None
    seed: Annotated[Optional[int], Field(ge=0, le=2**32 - 1), SimOption(
        "--sim-seed", "the rig's random seed (a whole number)", "SEED",
        number_parser(int, low=0, high=2**32 - 1, what="a seed (a whole number)", example="0"))] = None
    perturb: Annotated[Optional[int], Field(ge=0), SimOption(
        "--sim-perturb", "a hidden 'true rig' whose step-time parameters differ from the planner's by seeded "
        "factors (0.6–1.6×), not shown — a test bed for tuning (0: none)", "SEED", _perturb)] = None
    truth: Annotated[Optional[dict], SimOption(
        "--sim-truth", "a hidden 'true rig' described in a YAML file: how its cards differ from the model by "
        "configuration and step (docs/sim-truth.md), not shown — a test bed for tuning and a what-if", "FILE",
        _truth_file)] = None
    spec_acceptance: Annotated[Optional[float], Field(ge=0, le=1), SimOption(
        "--sim-spec-acceptance", "with --speculative-config: the chance each draft token is accepted given the one "
        "before (0-1; position i: A^i; default 0.7)", "A", _checked_acceptance)] = None
    cooling: Annotated[Optional[str], SimOption(
        "--sim-cooling", "how well the cards are cooled: a preset (open, blower4, chassis8, poor) or a factor "
        f"{COOLING_RANGE[0]:g}-{COOLING_RANGE[1]:g} of a cooler that holds 80 °C at TDP in a 25 °C room (2: twice "
        "as hot above the room; default blower4 up to 4 cards, chassis8 above)", "PRESET|FACTOR", cooling_text,
        label="Cooling", choices=tuple(COOLING))] = None
    ambient_c: Annotated[Optional[float], SimOption(
        "--sim-ambient-c", f"the room's temperature around the cards, °C ({AMBIENT_RANGE_C[0]:g}-"
        f"{AMBIENT_RANGE_C[1]:g}; default {DEFAULT_AMBIENT_C:g})", "°C",
        number_parser(float, low=AMBIENT_RANGE_C[0], high=AMBIENT_RANGE_C[1], what="a temperature in °C",
                      example="25"), label="Ambient °C")] = None

    @field_validator("*", mode="before")
    @classmethod
    def _option(cls, v: Any, info) -> Any:
        """Every value through its option's ``parse`` (a profile's YAML, a form's text)."""
        opt = SIM_RIG_OPTIONS.get(info.field_name)
        if info.field_name == "truth" and v is not None:
            return _inline_truth(v)
        if v is None or opt is None or isinstance(v, bool):
            return v
        return opt.parse(v if isinstance(v, str) else str(v))

    def argv(self) -> list[str]:
        """The sim server's own options (``--sim-gpu …``, app.sim.server): every option set,
        in declaration order."""
        out: list[str] = []
        for name, opt in SIM_RIG_OPTIONS.items():
            v = getattr(self, name)
            if v is not None:
                out += [opt.flag, opt.text(v)]
        return out

    @classmethod
    def option_value(cls, name: str, text: str) -> Any:
        """Field ``name``'s value from the text a user typed (empty: None — the rig's
        default). Raises ValueError naming the option's flag and what is wanted."""
        opt = SIM_RIG_OPTIONS[name]
        if not str(text).strip():
            return None
        try:
            return opt.parse(str(text).strip())
        except ValueError as e:
            raise ValueError(f"{opt.flag}: {e}") from None


#: field name → its SimOption, in field order (= the sim server's argv order = the form's order)
SIM_RIG_OPTIONS: dict[str, SimOption] = {
    name: spec
    for name, info in SimRig.model_fields.items()
    for spec in info.metadata
    if isinstance(spec, SimOption)
}


class HardwareFingerprint(BaseModel):
    """The hardware a profile is for / a run was recorded on.

    ``gpu``: card name (catalog or NVML name; mixed rigs joined by ``" + "``; ``CPU``
    for the CPU build of vLLM). ``count``: cards. ``memory_gib``: one card's total
    memory (GiB) — for ``CPU`` the host memory the planner may use.
    ``compute_capability``: the cards' (lowest) CUDA compute capability, e.g. 8.9 — what
    lets a card the GPU catalog does not know plan. ``driver``: NVIDIA driver version;
    ``vllm_version``; ``recorded_at``: Unix time it was filled in from a run (None for a
    hand-written target). ``hosts``/``link``: the cards sit in that many hosts, evenly,
    joined by that link of the link catalog (None: one host) — :meth:`rig_layout`.
    ``cores``: for ``CPU``, the cores the CPU build may use on each host (a rig's hosts'
    fewest; app.planner.cards.host_cores on each host, reported by its agent).
    """

    model_config = ConfigDict(extra="forbid")
    gpu: str
    count: int = Field(1, ge=1, le=1024)
    memory_gib: Optional[float] = Field(None, gt=0)
    compute_capability: Optional[float] = Field(None, gt=0)
    driver: Optional[str] = None
    vllm_version: Optional[str] = None
    recorded_at: Optional[float] = None
    hosts: Optional[int] = Field(None, ge=1, le=1024)
    link: Optional[str] = None
    cores: Optional[int] = Field(None, ge=1)

    def rig_layout(self):
        """The planner's :class:`app.engine.gpu.RigLayout` of several hosts (``hosts`` >
        1 with a ``link`` and a count they divide), else None (one host, as before)."""
        if not self.hosts or self.hosts < 2 or not self.link or self.count % self.hosts:
            return None
        return rig_layout(self.hosts, self.count // self.hosts, self.link)

    @property
    def is_cpu(self) -> bool:
        return self.gpu.strip().upper() == "CPU"

    def cards_text(self) -> str:
        """The cards in short: ``4× RTX 4090``, ``1× CPU (2 cores)``; a rig of several
        hosts each holding the same share, ``4 hosts × 1× RTX 4090``."""
        hosts = self.hosts if self.hosts and self.hosts > 1 and self.count % self.hosts == 0 else None
        one = f"{self.count // hosts if hosts else self.count}× {self.gpu}"
        if self.cores and self.is_cpu:
            one += f" ({self.cores} cores)"
        return f"{hosts} hosts × {one}" if hosts else one

    def describe(self) -> str:
        s = self.cards_text()
        if self.rig_layout() is not None:
            s += f" ({self.link})"
        if self.driver:
            s += f", driver {self.driver}"
        if self.vllm_version:
            s += f", vLLM {self.vllm_version}"
        return s

    def planner_cards(self) -> list:
        """The cards as the planner's ``GpuSpec`` list, chosen by
        :func:`app.planner.cards.cards_for` from ``gpu`` (mixed names taken in turn),
        ``count``, ``memory_gib`` and ``compute_capability``. ``CPU`` → ``count`` host
        devices with ``memory_gib`` (default: one NUMA node's memory of this machine) and
        this machine's real core count. Raises ``app.planner.gpus.UnknownGpuError`` for a
        name the catalog does not know without ``memory_gib`` and
        ``compute_capability``."""

        return cards_for(engine=Engine.VLLM, gpu=self.gpu, count=self.count, memory_gib=self.memory_gib,
                         cc=self.compute_capability)


class LevelResult(BaseModel):
    """One ramp level of a results summary: ``level`` (concurrency, or req/s in rate
    mode), ``output_tps`` output tokens/s, ``ttft_p99``/``tpot_p99`` seconds,
    ``failure_rate`` 0–1, ``rps`` successful requests/s."""

    model_config = ConfigDict(extra="forbid")
    level: float
    output_tps: float = 0.0
    ttft_p99: Optional[float] = None
    tpot_p99: Optional[float] = None
    failure_rate: float = 0.0
    rps: Optional[float] = None
    slo_met: Optional[bool] = None


class ResultsSummary(BaseModel):
    """What a recorded run measured, kept with the profile as evidence.

    ``run_id``: the run in the run store (may be gone later); ``recorded_at``: Unix
    time; ``which``: ``best`` (highest peak throughput) or ``latest``; ``status``: the
    ramp's end (done, slo_broken, …); ``knee``: the knee level (None if not found);
    ``best_level``: the level with the most output tokens/s among those meeting the
    SLO (all levels when no SLO); ``peak_output_tps`` its throughput; ``users_at_slo``:
    the most users (or req/s) that met the SLO, and ``verdict`` the run's one-sentence
    answer (app.run.verdict), when the run had an SLO.
    """

    model_config = ConfigDict(extra="forbid")
    run_id: Optional[int] = None
    recorded_at: Optional[float] = None
    which: Literal["best", "latest"] = "latest"
    status: Optional[str] = None
    knee: Optional[float] = None
    best_level: Optional[float] = None
    peak_output_tps: Optional[float] = None
    users_at_slo: Optional[float] = None
    verdict: Optional[str] = None
    levels: list[LevelResult] = Field(default_factory=list)

    @classmethod
    def from_levels(cls, levels: list[dict[str, Any]], *, run_id: int | None = None, status: str | None = None,
                    knee: float | None = None, recorded_at: float | None = None,
                    which: str = "latest") -> "ResultsSummary":
        """Build from StepStats dicts (RunStore.levels) — keys ``level``, ``output_tps``,
        ``ttft_p99``, ``tpot_p99``, ``failure_rate``, ``rps``, ``slo_broken``."""
        rows = [LevelResult(level=d["level"], output_tps=d.get("output_tps") or 0.0, ttft_p99=d.get("ttft_p99"),
                            tpot_p99=d.get("tpot_p99"), failure_rate=d.get("failure_rate") or 0.0,
                            rps=d.get("rps"), slo_met=(not d.get("slo_broken")) if "slo_broken" in d else None)
                for d in levels]
        best = peak_level(rows)
        return cls(run_id=run_id, recorded_at=time.time() if recorded_at is None else recorded_at, which=which,
                   status=status, knee=knee, best_level=best.level if best else None,
                   peak_output_tps=best.output_tps if best else None, levels=rows)


def _normalize_server(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError("server must be a mapping of vLLM option: value (a `vllm serve --config` file)")
    out: dict[str, Any] = {}
    for k, v in data.items():
        if not isinstance(k, str) or not k.strip("-"):
            raise ValueError(f"server key {k!r} is not an option name; use vLLM's long names such as max-num-seqs")
        key = option_name(k.lstrip("-").strip())
        out[key] = v
    return out


def _strings(val: Any, depth: int = 0) -> list[str]:
    """Every string inside an option value (lists and mappings walked, 8 levels deep)."""
    if isinstance(val, str):
        return [val]
    if depth >= 8:
        return []
    if isinstance(val, dict):
        val = list(val.keys()) + list(val.values())
    if isinstance(val, list):
        return [s for x in val for s in _strings(x, depth + 1)]
    return []


class Profile(BaseModel):
    """A tuning profile (see the module docstring for the YAML form).

    ``server`` is kept verbatim (dashed keys) so it can be handed to vLLM as a
    ``--config`` file; it is validated by building a :class:`~app.config.ServerConfig`
    from it (errors name ``server.<key>``). ``gpus``: a list of CUDA indices, or an int
    N = the first N cards, or None = all visible. ``ramp``: the RampSpec (its ``url``
    and ``model`` are set at launch and not stored). Raises
    ``pydantic.ValidationError`` on bad values.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: str = Field(..., min_length=1, max_length=120)
    description: str = ""
    engine: Engine = Engine.VLLM
    sim: Optional[SimRig] = None
    attach_url: Optional[str] = None
    server: dict[str, Any]
    env: dict[str, str] = Field(default_factory=dict)
    gpus: Union[list[int], int, None] = None
    ramp: RampSpec = Field(default_factory=lambda: RampSpec(**DEFAULT_RAMP))
    hosts: list[Host] = Field(default_factory=list)
    ray_address: Optional[str] = None
    hardware: Optional[HardwareFingerprint] = None
    results: Optional[ResultsSummary] = None
    notes: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        v = v.strip()
        if not v or any(c in v for c in "\n\r\t/\\\0"):
            raise ValueError(f"name {v!r}: one line of text without / or \\")
        return v

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, v: Any) -> Engine:
        e = Engine.parse(v)
        if e is None or not e.spec.selectable:
            raise ValueError(f"engine {v!r}: a profile runs {names(SELECTABLE)}")
        return e

    @field_validator("server", mode="before")
    @classmethod
    def _server(cls, v: Any) -> dict[str, Any]:
        d = _normalize_server(v)
        d.pop("port", None)  # chosen at launch; the loader warns about it
        if "api-key" in d:
            raise ValueError("server.api-key: secrets are never stored in a profile; set the environment "
                             "variable VLLM_API_KEY when you launch instead")
        if "model" not in d or not isinstance(d["model"], str) or not d["model"].strip():
            raise ValueError("server has no 'model': add 'model: <model directory or Hugging Face id>'")
        for k, val in d.items():
            if not isinstance(val, (str, int, float, bool, list)) and val is not None:
                if not isinstance(val, dict):
                    raise ValueError(f"server.{k}: {type(val).__name__} is not a vLLM option value")
            for text in _strings(val):
                bad = variable_problems(text)
                if bad:
                    raise ValueError(f"server.{k}: " + "; ".join(bad))
        return d

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("env must be a mapping NAME: value")
        out = {}
        for k, val in v.items():
            if not valid_env_name(k):
                raise ValueError(f"env key {k!r} is not an environment variable name")
            if k == "VLLM_API_KEY":
                raise ValueError("env.VLLM_API_KEY: secrets are never stored in a profile; set it in the "
                                 "environment you launch from")
            if isinstance(val, bool):
                val = "1" if val else "0"
            if not isinstance(val, (str, int, float)):
                raise ValueError(f"env.{k}: a value must be text or a number, not {type(val).__name__}")
            out[k] = str(val)
        return out

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Union[list[int], int, None]) -> Union[list[int], int, None]:
        if isinstance(v, bool):
            raise ValueError("gpus: give a count (first N cards) or a list of indices")
        if isinstance(v, int) and v < 1:
            raise ValueError(f"gpus={v}: give a count ≥ 1 (first N cards) or a list of indices")
        if isinstance(v, list):
            if any(i < 0 for i in v) or len(set(v)) != len(v):
                raise ValueError(f"gpus={v}: indices are distinct and ≥ 0, as nvidia-smi lists them")
        return v

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, v: Any) -> list[Host]:
        return hosts_from(v)  # errors name hosts[i] and the key; a password-like key is refused

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            parse_ray_address(v)  # ValueError naming ray_address and the form
            v = v.strip()
        return v

    @field_validator("ramp", mode="before")
    @classmethod
    def _ramp(cls, v: Any) -> Any:
        if v is None:
            return dict(DEFAULT_RAMP)
        if isinstance(v, dict):
            v = {k: x for k, x in v.items() if k not in ("url",)}
            if "levels" not in v and "max_level" not in v:
                v = {**v, "max_level": DEFAULT_RAMP["max_level"]}
        return v

    @model_validator(mode="after")
    def _whole(self) -> "Profile":
        try:
            self.server_config(resolve=False)
        except ValidationError as e:
            err = e.errors()[0]
            loc = [str(x) for x in err["loc"]]
            field = loc[0] if loc else "server"
            where = {"env": "env", "gpus": "gpus"}.get(field, f"server.{option_name(field)}")
            raise ValueError(f"{where}: {err['msg']}") from None
        if self.ray_address and self.server.get("distributed-executor-backend") != "ray":
            raise ValueError(f"ray_address {self.ray_address} names a Ray cluster for the Ray backend: add "
                             "'distributed-executor-backend: ray' to server:, or drop ray_address")
        if self.engine.simulated and self.sim is None:
            self.sim = SimRig()
        if not self.engine.launches and not self.attach_url:
            raise ValueError("engine attach needs attach_url: the base URL of the running server, "
                             "e.g. http://127.0.0.1:8000")
        return self

    def updated(self, **changes: Any) -> "Profile":
        """A validated copy with ``changes`` (field name → value; ``server``/``env`` replace
        the whole block). Raises ``pydantic.ValidationError``."""
        d = self.model_dump()
        d.update(changes)
        return Profile.model_validate(d)

    # ------------------------------------------------------------------ views
    @property
    def slo(self) -> SLO:
        """The ramp's SLO (a profile keeps it inside ``ramp``)."""
        return self.ramp.slo

    @property
    def model(self) -> str:
        return str(self.server["model"])

    def gpu_indices(self) -> list[int] | None:
        """``gpus`` as CUDA indices: an int N → ``[0 … N-1]``; None → all visible."""
        if isinstance(self.gpus, int):
            return list(range(self.gpus))
        return None if self.gpus is None else list(self.gpus)

    def server_config(self, resolve: bool = True) -> ServerConfig:
        """The :class:`ServerConfig` to launch (port unset: chosen at launch).

        ``resolve``: expand variables and make a local model path absolute
        (:func:`resolve_model_path`). Raises ``pydantic.ValidationError``.
        """
        server = dict(self.server)
        if resolve:
            server["model"] = resolve_model_path(str(server["model"]))
        return ServerConfig.from_vllm_config(server, env=dict(self.env), gpus=self.gpu_indices())

    def vllm_config(self, resolve: bool = True) -> dict[str, Any]:
        """The ``server:`` block as a ``vllm serve --config`` mapping (model resolved)."""
        d = dict(self.server)
        if resolve:
            d["model"] = resolve_model_path(str(d["model"]))
        return d

    def ramp_spec(self, url: str, model: str | None = None, **overrides: Any) -> RampSpec:
        """The RampSpec to run against ``url`` (served ``model`` name; None → ask the
        server), with any field ``overrides`` (e.g. ``levels=[1, 2]``)."""
        d = self.ramp.model_dump()
        d.update(url=url, model=model)
        d.update(overrides)
        if "levels" in overrides and "max_level" not in overrides:
            d["max_level"] = None
        return RampSpec(**d)

    def to_data(self) -> dict[str, Any]:
        """The YAML-ready mapping (defaults of nested blocks left out, ``ramp.url`` and
        ``ramp.model`` never written)."""
        d: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": self.name}
        if self.description:
            d["description"] = self.description
        d["engine"] = self.engine.value
        if self.sim is not None:
            d["sim"] = self.sim.model_dump(exclude_none=True)
        if self.attach_url:
            d["attach_url"] = self.attach_url
        d["server"] = dict(self.server)
        if self.env:
            d["env"] = dict(self.env)
        if self.gpus is not None:
            d["gpus"] = self.gpus
        ramp = self.ramp.model_dump(mode="json", exclude_defaults=True, exclude={"url", "model"})
        if "levels" in ramp and self.ramp.max_level is not None:
            ramp.pop("levels")  # derived from max_level
        d["ramp"] = ramp
        if self.hosts:
            d["hosts"] = [h.model_dump(exclude_defaults=True) or {"ssh": h.ssh} for h in self.hosts]
        if self.ray_address:
            d["ray_address"] = self.ray_address
        if self.hardware is not None:
            d["hardware"] = self.hardware.model_dump(exclude_none=True)
        if self.results is not None:
            d["results"] = self.results.model_dump(mode="json", exclude_none=True)
        if self.notes:
            d["notes"] = self.notes
        return d


def variant_name(name: str, base: "Profile | None", profile: "Profile", limit: int = 3) -> str:
    """A run's name that says what differs from the profile it was loaded from (issue 19,
    item 6): ``"demo · max_num_batched_tokens 8192, kv_cache_dtype fp8"`` — the
    ``vllm serve`` options (underscored), ``env NAME``, the engine, the sim rig, the
    cards, then the request shape (``prompt_tokens 1024``), at most ``limit`` named and
    ``+N more``; ``name`` alone when nothing differs or there is no ``base``."""
    if base is None:
        return name
    changes: list[str] = []

    def norm(d: dict[str, Any]) -> dict[str, Any]:
        return {k.replace("-", "_"): v for k, v in d.items()}

    a, b = norm(base.server), norm(profile.server)
    for k in list(dict.fromkeys([*b, *a])):
        if a.get(k) != b.get(k):
            changes.append(f"{k} {b[k]}" if b.get(k) not in (None, "") else f"{k} default")
    for k in sorted(set(base.env) | set(profile.env)):
        if base.env.get(k) != profile.env.get(k):
            changes.append(f"env {k}" + (f"={profile.env[k]}" if k in profile.env else " unset"))
    if base.engine != profile.engine:
        changes.append(f"engine {profile.engine}")
    rig = (lambda p: (p.sim.gpu, p.sim.count) if p.sim is not None else None)
    if profile.engine.simulated and rig(base) != rig(profile) and profile.sim is not None:
        changes.append(f"rig {profile.sim.count}× {profile.sim.gpu}")
    if base.gpus != profile.gpus:
        changes.append(f"gpus {profile.gpus if profile.gpus is not None else 'all'}")
    ra, rb = base.ramp.model_dump(), profile.ramp.model_dump()
    for k in ("prompt_tokens", "output_tokens", "prompts_file", "endpoint"):  # the request shape, not the levels
        if ra.get(k) != rb.get(k):
            v = rb.get(k)
            changes.append(f"{k} {','.join(map(str, v)) if isinstance(v, list) else v}")
    if not changes:
        return name
    shown = changes[:limit] + ([f"+{len(changes) - limit} more"] if len(changes) > limit else [])
    return f"{name} · {', '.join(shown)}"
