"""GPU source over HTTP: a simulated rig's ``GET /sim/telemetry``.

The body is a :class:`~app.telemetry.gpu_source.TelemetryDocument` as JSON (the same
readings NVML gives, for virtual cards). Proxies from the environment are ignored:
the rig is local. An unreachable or malformed document gives no readings for that
round (a gap) and a logged reason, never an exception.
"""
from __future__ import annotations

import logging
import urllib.error
import urllib.request

from pydantic import ValidationError

from app.telemetry.gpu_source import GpuReading, SessionInfo, SourceStatus, TelemetryDocument

log = logging.getLogger(__name__)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch_text(url: str, timeout: float) -> str:
    """GET ``url`` without proxies; returns the body as text. Raises OSError/ValueError."""
    with _OPENER.open(url, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


class HttpGpuSource:
    """``url``: the rig's base URL (``/sim/telemetry`` is appended unless already there).
    ``timeout``: seconds per request."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        base = url.rstrip("/")
        self.url = base if base.endswith("/sim/telemetry") else base + "/sim/telemetry"
        self.timeout = timeout
        self.status = SourceStatus(state="closed", message="not opened")
        self.last_error: str | None = None
        self._session = SessionInfo()

    def _get(self) -> TelemetryDocument | None:
        try:
            doc = TelemetryDocument.model_validate_json(fetch_text(self.url, self.timeout))
        except (OSError, ValueError, ValidationError) as e:
            reason = f"{self.url}: {type(e).__name__}: {e}".splitlines()[0]
            if reason != self.last_error:
                log.warning("GPU telemetry gap: %s", reason)
            self.last_error = reason
            return None
        self.last_error = None
        return doc

    def open(self) -> SourceStatus:
        doc = self._get()
        if doc is None:
            self.status = SourceStatus(state="error", message=f"cannot read GPU telemetry from {self.last_error}")
        else:
            self.status = doc.status
            self._session = doc.session
        return self.status

    def session_info(self) -> SessionInfo:
        return self._session

    def read(self) -> list[GpuReading]:
        doc = self._get()
        return [] if doc is None else doc.readings

    def close(self) -> None:
        self.status = SourceStatus(state="closed", message="closed")
