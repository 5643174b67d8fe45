"""The planner: before a launch, will it fit, how many users, what breaks; after a
failed launch, why (and the fix).

Modules: ``gpus`` (GPU catalog, NVML mapping), ``models`` (architecture from
config.json / HF cache / catalog), ``versions`` (vLLM version rules), ``memory``
(per-GPU memory plan), ``checks`` (verdicts, problem codes, fixes), ``plan``
(``plan(config, gpus, model, workload) -> Plan``), ``predict`` (the predicted ramp
and users at the SLO: the load generator's ramp run on the step-level engine of
``app.engine``), ``calibrate`` (fit a measured ramp, saved per hardware
fingerprint), ``compare`` (prediction vs reality), ``diagnose`` (log diagnosis),
``render`` and ``cli_plan`` (``vllm-dyno plan`` / ``diagnose``).
"""
