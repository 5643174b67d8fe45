"""The run controller and what it owns: sequencing (:mod:`app.run.controller`), the
headless run of a profile (:mod:`app.run.profile_run`), recording into the run store
(:mod:`app.run.record`), the hardware fingerprint and sim time scale
(:mod:`app.run.hardware`) and the safety stops (:mod:`app.run.safety`).

Every front end — the window, ``vllm-dyno run``, ``vllm-dyno ramp`` and the tuner —
drives a run through :class:`app.run.controller.RunController`.
"""
