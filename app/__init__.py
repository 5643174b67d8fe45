"""vLLM Dyno core (Qt-free): configuration, supervisor, load generator, telemetry,
planner, simulator and run store."""
from importlib import metadata as _md

try:
    __version__ = _md.version("vllm-dyno")
except _md.PackageNotFoundError:  # running from a checkout without install
    __version__ = "0.0.0+checkout"
