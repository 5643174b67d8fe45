"""The planner: before a launch, will it fit, how many users, what breaks; after a
failed launch, why (and the fix).

Modules: ``gpus`` (GPU catalog, NVML mapping), ``models`` (architecture from
config.json / HF cache / catalog), ``versions`` (vLLM version rules), ``memory``
(per-GPU memory plan), ``checks`` (verdicts, problem codes, fixes), ``plan``
(``plan(config, gpus, model, workload) -> Plan``), ``perf`` (step-time model and
predicted curve), ``calibrate`` (fit a measured ramp, saved per hardware
fingerprint), ``compare`` (prediction vs reality), ``diagnose`` (log diagnosis),
``render`` and ``cli_plan`` (``vllm-dyno plan`` / ``diagnose``).
"""
