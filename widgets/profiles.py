"""Profiles in the window: the form ↔ :class:`app.profiles.Profile` mapping.

Storage, validation, built-ins and import/export are app.profiles
(:class:`~app.profiles.ProfileLibrary`); keeping evidence only for unchanged settings
is :func:`app.profiles.edit.profile_from_settings`. This module only reads and fills
the widgets (the server form and the ramp form).
"""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.profiles import Profile, ProfileLibrary
from app.profiles.edit import DEMO_NAME, profile_from_settings

__all__ = ["DEMO_NAME", "apply_to_form", "form_profile", "library", "list_profiles"]


def library() -> ProfileLibrary:
    """The user's profiles (data dir, ``VLLM_DYNO_HOME`` honoured) and the built-ins."""
    return ProfileLibrary()


def list_profiles() -> list[str]:
    """Every profile name (built-ins and user profiles), sorted as the library sorts them."""
    return library().scan().names()


def ramp_fields(profile: Profile) -> dict[str, Any]:
    """The ramp of ``profile`` as the ramp form's fields (``levels`` or ``max_level`` …)."""
    d = profile.ramp.model_dump(mode="json", exclude={"url", "model"})
    if profile.ramp.max_level is not None:
        d.pop("levels", None)
    return d


def apply_to_form(profile: Profile, config_panel, ramp_panel) -> None:
    """Show ``profile`` in the server form and the ramp form."""
    sim = profile.sim
    attach_model = None if profile.engine.launches else profile.server.get("served-model-name")
    config_panel.set_engine(profile.engine, sim.gpu if sim else None, sim.count if sim else None,
                            profile.attach_url, attach_model, sim_rig=sim)
    config_panel.set_config(profile.server_config())
    ramp_panel.set_from_profile(ramp_fields(profile))


def form_profile(name: str, config_panel, ramp_panel, base: Profile | None = None,
                 hosts: list | None = None, ray_address: str | None = None) -> Profile:
    """The forms as a profile called ``name`` (see
    :func:`app.profiles.edit.profile_from_settings`; ``base`` is the profile whose notes
    and results may be kept, ``hosts`` and ``ray_address`` the rig the window launches
    on). Raises ValueError
    naming the field."""

    d = config_panel.to_profile()
    server = dict(d["server"])
    if server.get("host") == "127.0.0.1":
        server.pop("host")  # the default: never worth storing
    gpus = d.get("gpus")
    if gpus is None and base is not None:
        gpus = base.gpus  # the form shows cards only for engine vllm on a machine with NVML
    try:
        return profile_from_settings(name, engine=d["engine"], server=server, env=d.get("env"), gpus=gpus,
                                     sim=d.get("sim"), attach_url=d.get("attach_url"), ramp=ramp_panel.to_profile(),
                                     base=base, hosts=hosts, ray_address=ray_address)
    except ValidationError as e:
        raise ValueError("; ".join(f"{'.'.join(map(str, er['loc'])) or 'profile'}: {er['msg']}"
                                   for er in e.errors())) from None
