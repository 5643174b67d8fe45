"""The run controller and what it owns: sequencing (:mod:`app.run.controller`), what a
launch starts and its one builder (:mod:`app.run.target`), the servers it holds — a rig
of hosts, the local and attached checks and a server's telemetry (:mod:`app.run.handles`),
the running ramp (:mod:`app.run.ramp_state`), what a ramp produced with its verdict and
energy (:mod:`app.run.outcome`), the headless run of a profile
(:mod:`app.run.profile_run`), recording into the run store (:mod:`app.run.record`), the
hardware fingerprint and sim time scale (:mod:`app.run.hardware`) and the safety stops
(:mod:`app.run.safety`).

Every front end — the window, ``vllm-dyno run``, ``vllm-dyno ramp`` and the tuner —
drives a run through :class:`app.run.controller.RunController`.
"""
