"""``vllm-dyno telemetry [--url URL] [--seconds N]``: a live table of GPUs, host and server.

Per GPU: memory used/total and the driver-reserved share (NVML memory info v2; where the
driver has only v1, ``used`` includes reserved memory — the column says "in used*" and a
note under the table says why), utilization, temperature, power/limit, SM/memory clocks,
throttle reasons. Host: CPU %, memory. Server (``--url``): running, waiting, KV-cache
usage, token rates from ``/metrics``, and the server process tree's RSS/CPU (found as
the process listening on the URL's port, or ``--pgid``/``--pid``). A field a card does
not report shows ``n/a``; a metric the server does not export shows ``not exported``.
"""
from __future__ import annotations

import argparse
import sys
import time
import urllib.parse

from app.cli.common import http_url, index_list, positive_seconds, process_id

GiB = 2**30


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("telemetry", help="live table of GPU, host and server figures")
    p.add_argument("--url", type=http_url, help="server base URL, e.g. http://127.0.0.1:8000 (scrapes /metrics)")
    p.add_argument("--seconds", type=positive_seconds, help="stop after N seconds (default: until Ctrl-C)")
    p.add_argument("--refresh", type=positive_seconds, default=1.0, help="seconds between table prints (default 1)")
    p.add_argument("--gpus", type=index_list, help="GPU indices to read, e.g. 0,1,2,3 (default: all)")
    p.add_argument("--sim-url", type=http_url,
                   help="read virtual GPUs from a sim rig's /sim/telemetry instead of NVML")
    p.add_argument("--no-gpu", action="store_true", help="do not read GPUs")
    p.add_argument("--pgid", type=process_id, help="server process group (for its RSS/CPU)")
    p.add_argument("--pid", type=process_id, help="server root pid (for its RSS/CPU)")
    p.set_defaults(func=cmd_telemetry)


def listening_pid(url: str) -> int | None:
    """Pid of the local process listening on ``url``'s port, when visible (psutil)."""
    # deferred: only this command needs it (vllm-dyno starts light)
    import psutil

    u = urllib.parse.urlparse(url)
    if u.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.Error, OSError):
        return None
    return None


def _f(v, fmt: str, na: str = "n/a") -> str:
    return na if v is None else format(v, fmt)


def render(tel, url: str | None) -> str:
    """The table as text (one frame)."""
    lines = [f"t = {tel.clock.now():7.1f} s"]
    g = tel.gpu
    if g is not None:
        if not g.status.ok:
            lines.append(f"GPU: {g.status.message or g.status.state}")
        else:
            s = g.session
            lines.append(f"GPU: driver {s.driver_version or 'n/a'}, CUDA {s.cuda_version or 'n/a'}"
                         + ("" if s.p2p_ok is None else f", P2P {'yes' if s.p2p_ok else 'no'}"))
            lines.append(f"{'gpu':>3}  {'memory used/total':>20}  {'reserved':>9}  {'util':>5}  {'temp':>5}"
                         f"  {'power/limit W':>14}  {'SM/mem MHz':>11}  throttle")
            notes = []
            for i, r in sorted(g.latest.items()):
                if r.state == "lost":
                    lines.append(f"{i:>3}  lost: {r.unavailable.get('*', 'GPU is lost')}")
                    continue
                mem = (f"{_f(r.memory_used_bytes and r.memory_used_bytes / GiB, '.1f')}/"
                       f"{_f(r.memory_total_bytes and r.memory_total_bytes / GiB, '.1f')} GiB")
                if r.used_includes_reserved:
                    reserved = "in used*"
                    notes.append(f"* GPU {i}: {r.memory_note()}")
                else:
                    reserved = _f(r.memory_reserved_bytes and r.memory_reserved_bytes / GiB, '.1f')
                    reserved += " GiB" if r.memory_reserved_bytes is not None else ""
                lines.append(
                    f"{i:>3}  {mem:>20}  {reserved:>9}"
                    f"  {_f(r.util_gpu_pct, '.0f') + ('%' if r.util_gpu_pct is not None else ''):>5}"
                    f"  {_f(r.temp_gpu_c, '.0f') + ('C' if r.temp_gpu_c is not None else ''):>5}"
                    f"  {_f(r.power_w, '.0f') + '/' + _f(r.power_limit_w, '.0f'):>14}"
                    f"  {_f(r.clock_sm_mhz, '.0f') + '/' + _f(r.clock_mem_mhz, '.0f'):>11}"
                    f"  {', '.join(r.throttle) if r.throttle else ('n/a' if r.throttle is None else 'none')}")
            lines += notes
    h = tel.host.latest if tel.host is not None else {}
    if h:
        lines.append(f"host: CPU {h['host.cpu_pct']:.0f}%, memory {h['host.memory_used_bytes'] / GiB:.1f} GiB used,"
                     f" {h['host.memory_available_bytes'] / GiB:.1f} GiB available")
        if "server.rss_bytes" in h:
            lines.append(f"server tree: {h['server.processes']:.0f} processes, RSS {h['server.rss_bytes'] / GiB:.2f} GiB,"
                         f" CPU {h['server.cpu_pct']:.0f}% (100% = one core)")
    m = tel.metrics
    if m is not None:
        lt = m.latest
        if m.last_error:
            lines.append(f"server {url}: no metrics ({m.last_error})")
        elif lt.get("up"):
            kv = lt.get("kv_cache_usage")
            lines.append(
                f"server: running {_f(lt.get('running'), '.0f', 'not exported')}, waiting "
                f"{_f(lt.get('waiting'), '.0f', 'not exported')}, KV "
                f"{'not exported' if kv is None else format(kv * 100, '.1f') + '%'}, generation "
                f"{_f(lt.get('generation_tokens_per_s'), '.1f', '…')} tok/s, prompt "
                f"{_f(lt.get('prompt_tokens_per_s'), '.1f', '…')} tok/s"
                + (f", engines {len(lt['engines'])}" if len(lt.get("engines", [])) > 1 else ""))
        else:
            lines.append(f"server {url}: waiting for the first scrape")
    return "\n".join(lines)


def cmd_telemetry(a: argparse.Namespace) -> int:
    # deferred: only this command needs it (vllm-dyno starts light)
    from app.telemetry.hub import Telemetry, default_gpu_source

    gpus, url = a.gpus, a.url  # checked by their argparse types (app.cli.common)
    root_pid = a.pid if a.pid is not None else (listening_pid(url) if url and a.pgid is None else None)
    src = None if a.no_gpu else default_gpu_source(gpus, a.sim_url, a.pgid)
    tel = Telemetry(gpu_source=src, metrics_url=url, pgid=a.pgid, root_pid=root_pid)
    tel.start()
    t_end = None if a.seconds is None else time.monotonic() + a.seconds
    tty = sys.stdout.isatty()
    try:
        time.sleep(min(a.refresh, 1.0))
        while True:
            frame = render(tel, url)
            print(("\x1b[H\x1b[J" if tty else "") + frame + ("" if tty else "\n"), flush=True)
            if t_end is not None and time.monotonic() >= t_end:
                break
            time.sleep(a.refresh if t_end is None else max(0.0, min(a.refresh, t_end - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        tel.stop()
    return 0
