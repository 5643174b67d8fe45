"""The engines a server runs on, declared once (issue 33, item 5).

:class:`Engine` names them; it is a ``StrEnum``, so a member *is* its string — ``"vllm"``,
``"sim"``, ``"attach"``, ``"ray"`` — in profiles (YAML), runs (the store), tunes, the
agent's protocol, JSON output and the CLI's ``--engine`` choices, which keep the words
they had. Each member has one strategy, :class:`EngineSpec` (``engine.spec``), saying
what the rest of the app asks of an engine:

- **how it launches** (:class:`Launch`): ``vllm serve`` with the vLLM interpreter, the
  app's own simulated server, a host's ``ray start`` node, or nothing (a server already
  running at a URL); its stop grace, whether it is a headless part, which agent part
  runs it;
- **its cards** (:class:`Cards`): what the planner plans for and the run's hardware
  fingerprint says — this machine's (or a rig's hosts') real cards, the simulated rig's
  catalog cards, or unknown;
- **where its card telemetry comes from** (:class:`CardSamples`): NVML where the server
  runs, or the sim's own HTTP API; from the launch's first second or once it is ready;
- **which vLLM rules a plan follows**: a pinned version (the sim's) or the server's own,
  and whether a saved calibration applies.

Nothing outside this module compares an engine's name as a string
(``tests/unit/test_engine_names.py`` walks ``app/`` and ``widgets/``): code asks the
strategy (``engine.launches``, ``engine.simulated``, ``engine.spec.cards`` …), so a new
engine is a member and its :class:`EngineSpec` here, plus whatever of its own logic a new
:class:`Launch`, :class:`Cards` or :class:`CardSamples` kind needs where that kind is used.

Not an engine: the tuner's offline rig (:class:`app.tuner.offline.OfflineRig`) measures
a configuration on the step-level engine without any server; it is a rig the tuner
measures on (:class:`app.tuner.tune.MeasuringRig`), as the launching
:class:`app.tuner.tune.ControllerRig` is. Nor is the step-level engine of
``app.engine`` (the planner's and the sim's scheduler model).

This module imports nothing of the app: every layer may use it (pyproject.toml).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum


#: the vLLM version whose defaults, rules and wording the sim follows (app.sim.model_adapter)
SIM_VLLM_RULES = "0.32"


class Launch(Enum):
    """What launching an engine starts (app.server.launch builds the command)."""

    #: vLLM's OpenAI server (``vllm serve``, or the CPU build's api_server form) with the
    #: vLLM interpreter: the model must be there, the CPU build's defaults are filled in
    VLLM_SERVER = "vllm server"
    #: the app's simulated server (``python -m app.sim.server``) with the server's options
    #: and the simulated rig's (``--sim-*``)
    SIM_SERVER = "sim server"
    #: a host's Ray node (``ray start …``, run by its interpreter's Ray) under a
    #: multi-host launch with the Ray backend: no API server of its own
    RAY_NODE = "ray node"
    #: nothing: the server already runs at a URL
    NOTHING = "nothing"


class Cards(Enum):
    """The cards a server of the engine runs on, as the planner plans for them and a
    run's hardware fingerprint records them."""

    #: real cards where the server runs: this machine's (NVML, or the CPU build's host
    #: devices), or a rig's hosts' (their agents' hellos); named cards for a plan
    MACHINE = "machine"
    #: the simulated rig's catalog cards: its GPU name × count (a profile's ``sim:``),
    #: fingerprinted from the sim's ``/sim/info``
    SIM_RIG = "sim rig"
    #: unknown: the cards behind a URL are neither planned for nor fingerprinted
    UNKNOWN = "unknown"


class CardSamples(Enum):
    """Where the card telemetry — samples of power, memory, utilisation, clocks — comes from."""

    #: NVML on the machine the server runs on: this one (app.telemetry.nvml_source) — the
    #: window's "use NVML" and the CPU build permitting — or each host's, through its agent
    NVML = "nvml"
    #: the simulated server's own HTTP API (app.telemetry.http_source), once it is ready
    SIM_HTTP = "sim http"


@dataclass(frozen=True)
class EngineSpec:
    """One engine's strategy: every answer the app asks of it (see the module docstring).

    ``label``: the window's engine selector, ``hint`` its tooltip's words for it;
    ``short``: the status bar (``vLLM: ready``).
    ``selectable``: a profile's, the window's and a run's engine (``ray`` is only a host's
    part of a launch). ``tunable``: a tune launches its servers on it. ``launch``:
    :class:`Launch`. ``agent_part``: the part of a host's agent that runs it (``server``,
    ``ray``; None: no agent launches it). ``headless``: a part with no API server and no
    port of its own. ``stop_grace_s``: seconds from SIGTERM to SIGKILL when nothing else is
    asked. ``cards``: :class:`Cards`. ``card_samples``: :class:`CardSamples`;
    ``samples_from_launch``: the cards are sampled from the launch's first second (not
    only once the server is ready). ``may_be_sim``: the server behind it may turn out to be
    the sim (its ``/sim/info`` answers) and is then measured and recorded as one
    (:meth:`Engine.resolved`). ``vllm_rules``: the vLLM version whose defaults and rules
    its plans follow (None: the server's own version, detected or recorded);
    ``calibrated``: its plans use a saved calibration of the cards and a run of it can be
    calibrated from (the sim's step times are its own defaults)."""

    label: str
    hint: str
    short: str
    selectable: bool
    tunable: bool
    launch: Launch
    agent_part: str | None
    headless: bool
    stop_grace_s: float
    cards: Cards
    card_samples: CardSamples
    samples_from_launch: bool
    may_be_sim: bool
    vllm_rules: str | None
    calibrated: bool


class Engine(StrEnum):
    """The engine of a launch, a profile, a run or a tune; its strategy is :attr:`spec`."""

    VLLM = "vllm"
    SIM = "sim"
    ATTACH = "attach"
    RAY = "ray"

    @property
    def spec(self) -> EngineSpec:
        return SPECS[self]

    @classmethod
    def parse(cls, value: object) -> Engine | None:
        """``value`` as an engine; None when it names none (a store row of another version)."""
        if not isinstance(value, str):
            return None
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def launches(self) -> bool:
        """A launch starts a process (every engine but ``attach``, which connects to a URL)."""
        return self.spec.launch is not Launch.NOTHING

    @property
    def runs_vllm(self) -> bool:
        """A launch runs vLLM itself (its interpreter, version, model and CPU-build defaults matter)."""
        return self.spec.launch is Launch.VLLM_SERVER

    @property
    def simulated(self) -> bool:
        """The server is the app's simulator: a simulated rig (``SimRig``, ``--sim-*``) sets its cards."""
        return self.spec.cards is Cards.SIM_RIG

    @property
    def planned(self) -> bool:
        """The planner can plan it: its cards are known."""
        return self.spec.cards is not Cards.UNKNOWN

    def resolved(self, found_sim: bool) -> Engine:
        """The engine as measured and recorded: an attached server that turned out to be the
        sim (``found_sim``: its ``/sim/info`` answered) is the sim, with its cards."""
        return Engine.SIM if found_sim and self.spec.may_be_sim else self

    def plan_version(self, own: str | None) -> str | None:
        """The vLLM version whose rules a plan of this engine follows: its pinned rules (the
        sim's), else ``own`` — the server's version, detected or recorded."""
        return self.spec.vllm_rules or own


SPECS: dict[Engine, EngineSpec] = {
    Engine.VLLM: EngineSpec(
        label="vLLM", hint="launch the real server", short="vLLM", selectable=True, tunable=True,
        launch=Launch.VLLM_SERVER, agent_part="server", headless=False, stop_grace_s=20.0,
        cards=Cards.MACHINE, card_samples=CardSamples.NVML, samples_from_launch=True, may_be_sim=False,
        vllm_rules=None, calibrated=True),
    Engine.SIM: EngineSpec(
        label="Simulated rig", hint="a vLLM-compatible server timed by the performance model", short="sim",
        selectable=True, tunable=True,
        launch=Launch.SIM_SERVER, agent_part="server", headless=False, stop_grace_s=10.0,
        cards=Cards.SIM_RIG, card_samples=CardSamples.SIM_HTTP, samples_from_launch=False, may_be_sim=False,
        vllm_rules=SIM_VLLM_RULES, calibrated=False),
    Engine.ATTACH: EngineSpec(
        label="Attach to a URL", hint="benchmark a server that is already running", short="attach",
        selectable=True, tunable=False,
        launch=Launch.NOTHING, agent_part=None, headless=False, stop_grace_s=20.0,
        cards=Cards.UNKNOWN, card_samples=CardSamples.NVML, samples_from_launch=False, may_be_sim=True,
        vllm_rules=None, calibrated=True),
    Engine.RAY: EngineSpec(
        label="Ray node", hint="a host's Ray node under a multi-host launch with the Ray backend", short="ray",
        selectable=False, tunable=False,
        launch=Launch.RAY_NODE, agent_part="ray", headless=True, stop_grace_s=20.0,
        cards=Cards.MACHINE, card_samples=CardSamples.NVML, samples_from_launch=False, may_be_sim=False,
        vllm_rules=None, calibrated=True),
}

#: the engines a profile, the window's selector and a run may name, in the selector's order
SELECTABLE: tuple[Engine, ...] = tuple(e for e in Engine if e.spec.selectable)
#: the engines a tune launches its servers on (``vllm-dyno tune --engine``)
TUNABLE: tuple[Engine, ...] = tuple(e for e in Engine if e.spec.tunable)
#: the engines ``vllm-dyno serve --engine`` launches: selectable ones that start a server
SERVABLE: tuple[Engine, ...] = tuple(e for e in SELECTABLE if e.launches)
#: the engines an agent launches (app.hosts.agent), each as the part ``spec.agent_part``
AGENT_ENGINES: tuple[Engine, ...] = tuple(e for e in Engine if e.spec.agent_part is not None)


def names(engines: tuple[Engine, ...]) -> str:
    """``'vllm' or 'sim'``: the engines' names for a message."""
    quoted = [f"'{e.value}'" for e in engines]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
