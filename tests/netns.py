"""The multi-host test bed on one machine (issue 21): each "host" is a network namespace
with a veth pair to a bridge in the root namespace (private addresses 10.77.N.0/24, N
a subnet no other bed on this machine holds, chosen under a lock so that beds made at
once — the multinode tier's xdist workers, two runs — do not meet), and an SSH server in it
(tests/ssh_server.py: asyncssh's server, a generated host key, one authorized client
key). The test process reaches the hosts at their addresses through the bridge; the
hosts reach each other on it too.

Needs root (``ip netns``); :func:`unavailable` says why not otherwise. :meth:`Bed.close`
tears everything down — the processes in the namespaces, the namespaces, the bridge —
and is safe to call after a partial setup or a failed test.
"""
from __future__ import annotations

import fcntl
import importlib.util
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SSH_PORT = 2222
#: the beds this process made: with the pid, a tag no other bed's names share
_BEDS = itertools.count()
#: held while a bed picks its subnet and adds its bridge (beds made at once by xdist workers)
LOCK = Path(tempfile.gettempdir()) / "dyno-netns-bed.lock"


def _free_subnet(start: int) -> int:
    """The first N from ``start`` (wrapping in 20…219) with no address 10.77.N.x on any
    link of the root namespace."""
    used = _ip("-o", "addr", "show").stdout
    for k in range(200):
        n = 20 + (start - 20 + k) % 200
        if f" 10.77.{n}." not in used:
            return n
    raise RuntimeError("no free 10.77.N.0/24 subnet for a test bed: 200 beds are up (ip -o addr show)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


def unavailable() -> str | None:
    """Why the bed cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns); the multinode tests run as root, as CI does"
    if importlib.util.find_spec("asyncssh") is None:  # the bed's SSH server
        return "asyncssh is not installed (make deps)"
    probe = f"dyno-probe-{os.getpid()}"
    try:
        r = _ip("netns", "add", probe, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the ip command is not available ({e}); install iproute2"
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class NsHost:
    """One host of the bed: namespace ``ns``, ``address`` (its private IPv4), the SSH
    server's process and port."""

    ns: str
    address: str
    port: int = SSH_PORT
    server: subprocess.Popen | None = None
    veth: str = ""  # its veth end on the bridge (root namespace)

    def set_link(self, up: bool) -> None:
        """Cut the host off the network (its veth end down) or bring it back."""
        _ip("link", "set", self.veth, "up" if up else "down")

    @property
    def destination(self) -> str:
        return f"root@{self.address}:{self.port}"

    def pids(self) -> list[int]:
        """Every process in the namespace (``ip netns pids``)."""
        r = _ip("netns", "pids", self.ns, check=False)
        return [int(x) for x in r.stdout.split()]

    def app_pids(self) -> list[int]:
        """The processes of the namespace other than its SSH server, kernel threads and
        zombies: what the app started there (its agent, its server part)."""
        import psutil

        out = []
        for p in self.pids():
            try:
                proc = psutil.Process(p)
                if p != self.server.pid and proc.ppid() != 0 and "ssh_server" not in " ".join(proc.cmdline()) \
                        and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out


@dataclass
class Bed:
    """The bed: ``hosts``, the key files (``client_key``, ``known_hosts`` with every
    host's key, ``host_key``), ``tmp`` its folder."""

    tag: int
    subnet: int
    tmp: Path
    hosts: list[NsHost] = field(default_factory=list)
    bridge: str = ""
    client_key: Path = Path()
    known_hosts: Path = Path()
    host_key: Path = Path()

    @classmethod
    def make(cls, n: int = 2) -> "Bed":
        # deferred: the bed's keys need asyncssh, which unavailable() checked first
        import asyncssh

        tag = (os.getpid() * 8 + next(_BEDS)) % 100000
        bed = cls(tag=tag, subnet=0, tmp=Path(tempfile.mkdtemp(prefix="dyno-bed-")))
        try:
            with open(LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                bed.subnet = _free_subnet(20 + os.getpid() % 200)
                bed.bridge = f"dyb{tag}"
                _ip("link", "add", bed.bridge, "type", "bridge")
                _ip("addr", "add", f"10.77.{bed.subnet}.1/24", "dev", bed.bridge)
            bed._keys(asyncssh, n)
            _ip("link", "set", bed.bridge, "up")
            for i in range(n):
                bed._add_host(i)
            for h in bed.hosts:
                bed._start_server(h)
        except BaseException:
            bed.close()
            raise
        return bed

    def _keys(self, asyncssh, n: int) -> None:
        hk = asyncssh.generate_private_key("ssh-ed25519")
        ck = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key = self.tmp / "host_key"
        hk.write_private_key(str(self.host_key))
        self.client_key = self.tmp / "id_ed25519"
        ck.write_private_key(str(self.client_key))
        (self.tmp / "authorized_keys").write_bytes(ck.export_public_key())
        pub = hk.export_public_key().decode().strip()
        self.known_hosts = self.tmp / "known_hosts"
        self.known_hosts.write_text("".join(f"[10.77.{self.subnet}.{i + 2}]:{SSH_PORT} {pub}\n" for i in range(n)))
        os.chmod(self.client_key, 0o600)

    def _add_host(self, i: int) -> None:
        ns = f"dyno-{self.tag}-{i}"
        h = NsHost(ns, f"10.77.{self.subnet}.{i + 2}")
        _ip("netns", "add", ns)
        self.hosts.append(h)
        veth = h.veth = f"dyv{self.tag}{i}"
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{h.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def _start_server(self, h: NsHost) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        h.server = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, sys.executable, str(ROOT / "tests" / "ssh_server.py"),
             "--listen", h.address, "--port", str(h.port), "--host-key", str(self.host_key),
             "--authorized-keys", str(self.tmp / "authorized_keys"), "--cwd", str(ROOT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
        line = h.server.stdout.readline()
        if not line.startswith("listening"):
            raise RuntimeError(f"the SSH server of {h.ns} did not start: {line}{h.server.stderr.read()[-2000:]}")

    def close(self) -> None:
        """Tear down: every process in the namespaces (SIGKILL), the namespaces (their
        veth ends go with them), the bridge, the key folder."""
        for h in self.hosts:
            if h.server is not None and h.server.poll() is None:
                h.server.kill()
            for pid in h.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if h.server is not None:
                try:
                    h.server.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + 5
            while h.pids() and time.monotonic() < deadline:
                time.sleep(0.05)
            if h.veth:  # the pair goes with its namespace only once nothing holds that (a socket
                _ip("link", "del", h.veth, check=False)  # of a cut-off host can): delete it here
            _ip("netns", "del", h.ns, check=False)
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)
        for f in self.tmp.glob("*"):
            f.unlink()
        self.tmp.rmdir()
