"""The step-level engine: vLLM's scheduler (:mod:`app.engine.scheduler`), the
step-time model (:mod:`app.engine.steptime`) on a device (:mod:`app.engine.gpu`) and the
offline loop that runs them without HTTP (:mod:`app.engine.offline`).

One package below both the planner's predictions (app.planner) and the simulated rig's
HTTP server (app.sim), so that both use the same engine. It imports nothing else of
``app``.
"""
