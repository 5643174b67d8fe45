"""Telemetry: what the cards feel (NVML or a sim rig over HTTP), the host (psutil) and what
the server says (/metrics), sampled on the session clock.

Modules: ``gpu_source`` (interface + JSON shape), ``nvml_source``, ``http_source``,
``nvml_double`` (pynvml-shaped stand-in), ``gpu_sampler``, ``host_sampler``,
``metrics_parse`` + ``metrics_scraper``, ``series`` (samples, ring buffers),
``recorder`` (run store writer), ``derived`` (per-level figures), ``hub`` (one
session's samplers), ``cli_telemetry`` (``vllm-dyno telemetry``).
"""
