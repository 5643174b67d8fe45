"""Log lines in vLLM's format, printed to stdout and flushed at once.

``(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:L] message`` — the shape that
:class:`app.server.logparse.LogParser` and the planner's diagnosis read
(docs/vllm-facts.md, "Startup log lines").
"""
from __future__ import annotations

import os
import sys
import time


def line(message: str, level: str = "INFO", process: str = "APIServer", where: str = "api_server.py:1") -> str:
    """One formatted line (no newline)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"({process} pid={os.getpid()}) {level} {stamp} [{where}] {message}"


def emit(message: str, level: str = "INFO", process: str = "APIServer", where: str = "api_server.py:1") -> None:
    """Print one vLLM-format line to stdout and flush."""
    sys.stdout.write(line(message, level, process, where) + "\n")
    sys.stdout.flush()
