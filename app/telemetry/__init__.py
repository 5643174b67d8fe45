"""Telemetry: what the cards feel (NVML or a sim rig over HTTP), the host (psutil) and what
the server says (/metrics), sampled on the session clock.

Modules: ``gpu_source`` (interface + JSON shape), ``nvml`` (the one module that
imports ``pynvml``: init/shutdown, card facts, GPU memory per process), ``nvml_source``,
``http_source``, ``gpu_sampler``, ``host_sampler``,
``metrics_parse`` + ``metrics_scraper``, ``names`` (every series' name and unit,
declared once), ``periodic`` (the samplers' loop), ``series`` (samples, ring buffers),
``store_writer`` (run store writer), ``derived`` (per-level figures), ``throttle`` (NVML's
clocks-event reasons), ``hub`` (one session's samplers). ``vllm-dyno telemetry`` is
``app.cli.telemetry``. The pynvml-shaped
double that tests and benchmarks pass as ``nvml=`` is ``tests/nvml_double.py`` (not
shipped).
"""
