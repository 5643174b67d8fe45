"""A rig of hosts for thread-based callers: every host's agent, opened together.

The run controller, the samplers and the supervisor work on threads; the links to the
agents (:class:`app.hosts.link.AgentLink`) are asyncio. :class:`Rig` runs one event loop
on its own daemon thread and offers blocking calls: :meth:`Rig.open` starts every host's
agent at once (a host that fails closes the others and raises its
:class:`~app.hosts.link.HostError`), :meth:`Rig.subscribe` hands every host's samples
(on the session clock, sources prefixed with the host) to a telemetry subscriber such as
a :class:`~app.telemetry.series.SeriesBank`, :meth:`Rig.watch`, :meth:`Rig.call` for any
coroutine of a link, :meth:`Rig.close`. Subscribers are called on the rig's thread, as
a sampler's are on its own.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Sequence

from app.clock import SessionClock
from app.hosts.link import AgentLink, HostError, SshOptions
from app.hosts.protocol import ClockOffset
from app.hosts.spec import Host
from app.telemetry.series import Subscriber


class Rig:
    """The agents of ``hosts`` (the session's ``clock``; ``ssh`` options)."""

    def __init__(self, hosts: Sequence[Host], *, clock: SessionClock | None = None, ssh: SshOptions | None = None
                 ) -> None:
        if not hosts:
            raise ValueError("a rig needs at least one host")
        self.hosts = list(hosts)
        self.clock = clock or SessionClock()
        self.ssh = ssh or SshOptions()
        self.links: list[AgentLink] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dyno-rig", daemon=True)
        self._thread.start()
        self._subs: list[Subscriber] = []
        self._lost: list[Callable[[str, str], None]] = []

    def call(self, coro: Awaitable[Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the rig's loop and wait for its result (raises what it raises)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def open(self, timeout: float = 120.0) -> None:
        """Start every host's agent at once. Raises the first :class:`HostError` (in host
        order), after closing the agents that did start."""
        async def one(h: Host) -> AgentLink:
            return await AgentLink.open(h, clock=self.clock, ssh=self.ssh)

        async def all_() -> list[Any]:
            return await asyncio.gather(*(one(h) for h in self.hosts), return_exceptions=True)

        results = self.call(all_(), timeout)
        ok = [r for r in results if isinstance(r, AgentLink)]
        bad = [r for r in results if not isinstance(r, AgentLink)]
        if bad:
            for link in ok:
                self.call(link.close(), 60.0)
            err = next((b for b in bad if isinstance(b, HostError)), bad[0])
            raise err
        self.links = ok
        for link in ok:
            self._loop.call_soon_threadsafe(link.keep_clock)  # the offset measured again every minute
            for cb in self._subs:
                link.subscribe(cb)
            for lcb in self._lost:
                link.on_lost(lcb)

    def subscribe(self, cb: Subscriber) -> Subscriber:
        """``cb(samples)`` for every host's samples (now and for links opened later)."""
        self._subs.append(cb)
        for link in self.links:
            link.subscribe(cb)
        return cb

    def on_lost(self, cb: Callable[[str, str], None]) -> None:
        """``cb(host, why)`` when a host's link ends without :meth:`close`."""
        self._lost.append(cb)
        for link in self.links:
            link.on_lost(cb)

    def watch(self, interval: float = 1.0, gpu_interval: float = 0.5) -> list[dict[str, Any]]:
        """Start every host's telemetry; each host's ``watching`` reply."""
        return [self.call(link.watch(interval, gpu_interval), 60.0) for link in self.links]

    @property
    def offsets(self) -> dict[str, ClockOffset | None]:
        """Each host's clock offset (its clock − the app's), by destination."""
        return {link.host.label(): link.offset for link in self.links}

    def close(self, timeout: float = 60.0) -> None:
        """Close every link (each agent stops its server and exits), then the loop."""
        async def all_() -> None:
            await asyncio.gather(*(link.close() for link in self.links), return_exceptions=True)

        if self._loop.is_running():
            try:
                self.call(all_(), timeout)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(10)
                self._loop.close()

    def __enter__(self) -> "Rig":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
