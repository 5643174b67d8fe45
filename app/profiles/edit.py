"""Editing a profile from a settings form (the GUI's, or any other front end's).

:func:`profile_from_settings` turns what a form holds (engine, rig, ``--config``
mapping, environment, GPUs, ramp) into a validated :class:`Profile`, keeping what the
form does not show (description, notes) from the profile it was loaded from — and that
profile's results and hardware fingerprint only while the settings they were measured
with are unchanged (evidence must match the settings it is kept with).
"""
from __future__ import annotations

from typing import Any

from app.engines import Engine
from app.hosts.spec import Host
from app.profiles.model import Profile

#: the blocks a run's results depend on: change one and the results no longer apply
MEASURED_FIELDS = ("engine", "sim", "attach_url", "server", "env", "gpus")

#: the built-in a fresh install opens on (the simulated rig needs no GPU)
DEMO_NAME = "Sim demo: 8x RTX 4090 Llama-3-70B AWQ"


def profile_from_settings(name: str, *, engine: Engine | str, server: dict[str, Any], env: dict[str, str] | None = None,
                          gpus: list[int] | int | None = None, sim: dict[str, Any] | None = None,
                          attach_url: str | None = None, ramp: dict[str, Any] | None = None,
                          base: Profile | None = None, hosts: list[Host] | None = None,
                          ray_address: str | None = None) -> Profile:
    """A profile called ``name`` from form values.

    ``server``: a ``vllm serve --config`` mapping (long option names); ``sim``: ``{gpu,
    count}`` for engine sim; ``ramp``: RampSpec fields (rig seconds; ``url``/``model``
    ignored). ``base``: the profile the form was loaded from — its description and notes
    are kept, its ``results`` and ``hardware`` too when engine, rig, server, env and GPUs
    are unchanged. ``hosts``: the rig's machines (no form field sets them: a window
    passes the hosts it launches on, those of the profile it loaded, whatever the name
    saved under — a "Save as" keeps them); None: ``base``'s, else none. ``ray_address``:
    the running Ray cluster the rig attaches to, passed like ``hosts`` (None with
    ``hosts`` None: ``base``'s). Raises
    ``pydantic.ValidationError`` (the message names the field).
    """
    data: dict[str, Any] = {"name": name, "engine": engine, "server": dict(server), "env": dict(env or {}),
                            "gpus": gpus}
    eng = Engine.parse(engine)  # None: not an engine (the profile's validation names it)
    if eng is not None and eng.simulated:
        data["sim"] = dict(sim or {})
    if eng is not None and not eng.launches:
        data["attach_url"] = attach_url
    if ramp is not None:
        data["ramp"] = {k: v for k, v in ramp.items() if k not in ("url", "model")}
    if hosts is None and base is not None:
        hosts, ray_address = base.hosts, ray_address or base.ray_address
    if hosts:
        data["hosts"] = [h.model_dump(exclude_none=True) for h in hosts]
    if ray_address:
        data["ray_address"] = ray_address
    if base is not None:
        data["description"], data["notes"] = base.description, base.notes
        if eng is not None and eng.simulated and base.sim is not None:
            data["sim"] = {**base.sim.model_dump(exclude_none=True), **data["sim"]}
        new = Profile.model_validate(data)
        if _same_settings(base, new):
            return new.updated(results=base.results, hardware=base.hardware)
        return new
    return Profile.model_validate(data)


def _same_settings(a: Profile, b: Profile) -> bool:
    """Whether a run of ``a`` measured ``b`` too: same engine and rig (or URL), same
    effective launch settings (vLLM's defaults filled in: an unset
    ``gpu_memory_utilization`` is 0.9), same environment and cards."""
    def url(p: Profile) -> str | None:  # only an attached server is its URL
        return None if p.engine.launches else p.attach_url

    if (a.engine, url(a)) != (b.engine, url(b)):
        return False
    if a.engine.simulated and a.sim is not None and b.sim is not None \
            and (a.sim.gpu, a.sim.count) != (b.sim.gpu, b.sim.count):
        return False

    def eff(p: Profile) -> dict[str, Any]:
        d = p.server_config(resolve=False).model_dump(exclude={"host", "port", "gpus"})
        d["gpu_memory_utilization"] = d.get("gpu_memory_utilization") or 0.9
        return d

    return eff(a) == eff(b) and (a.engine.simulated or a.gpu_indices() == b.gpu_indices())
