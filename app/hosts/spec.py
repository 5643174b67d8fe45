"""The hosts of a rig: where each part of a server runs (issue 21, item 1).

A profile's ``hosts:`` block names the machines of a rig of several hosts; a profile
without one is the one-host rig on this machine (``localhost``), exactly as before::

    hosts:
      - ssh: dyno@10.0.0.11          # SSH destination user@host[:port]
        python: /opt/vllm/bin/python  # the vLLM interpreter there (default: found there)
        gpus: [0, 1]                  # the cards to use there (default: all)
      - ssh: dyno@10.0.0.12:2222
        dyno: /opt/dyno/bin/vllm-dyno # how to run vllm-dyno there (default: vllm-dyno)
        link: ib-hdr200               # its network to the other hosts (link catalog; for the planner)

SSH goes through asyncssh (:mod:`app.hosts.ssh`): keys come from the user's agent and
``~/.ssh/config``, host keys are checked against ``known_hosts``. A profile never holds a
password, passphrase or key: a ``hosts`` entry with such a key is refused naming it
(:data:`SECRET_KEY_RE`).
"""
from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from app.planner.gpus import LinkSpec, link_name, lookup_link

#: the destination of this machine itself: no SSH, the agent runs as a local process
LOCALHOST = "localhost"
#: names and addresses that are this machine
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
#: the SSH port when the destination gives none (IANA's ssh 22/tcp)
SSH_PORT = 22
#: key names of a hosts entry that would hold a secret (password, passphrase, private
#: key, token …): refused, never stored — authentication is the SSH agent's and
#: ``~/.ssh/config``'s
SECRET_KEY_RE = re.compile(r"pass(wd|word|phrase)?|secret|token|private[_-]?key|^key$|credential", re.IGNORECASE)

_USER_RE = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,63}")
_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def secret_key_problem(key: Any) -> str | None:
    """Why a hosts entry may not have the key ``key`` (None: it may): a password,
    passphrase, private key or token is never stored in a profile."""
    if SECRET_KEY_RE.search(str(key)):
        return ("a host never keeps a password, passphrase or key in a profile; SSH authenticates with your keys — "
                "load them in your SSH agent (ssh-add) or name them in ~/.ssh/config (IdentityFile)")
    return None


def hosts_secret_problem(data: Any) -> tuple[str, str] | None:
    """The first key of a ``hosts:`` value that would hold a secret, as ``(key path,
    why)`` (``hosts[0].password``), None when there is none. Checked before unknown keys
    are dropped, so that a password is refused, never just left out."""
    for i, item in enumerate(data if isinstance(data, list) else ()):
        for k in item if isinstance(item, dict) else ():
            why = secret_key_problem(k)
            if why:
                return f"hosts[{i}].{k}", why
    return None


class DestinationError(ValueError):
    """An SSH destination that cannot be parsed; the message names it and the form."""


def parse_destination(text: str) -> tuple[Optional[str], str, Optional[int]]:
    """``user@host[:port]`` → ``(user or None, host, port or None)``.

    ``host`` is a host name (RFC 1123 labels), an IPv4 address or an IPv6 address in
    brackets (``[fd00::1]:2222``; a bare IPv6 address without a port is taken whole).
    ``port`` 1–65535. Raises :class:`DestinationError` naming the destination."""
    d = str(text).strip()
    form = "give user@host or user@host:port (e.g. dyno@10.0.0.11:22)"
    if not d:
        raise DestinationError(f"an empty SSH destination: {form}")
    if any(c.isspace() for c in d) or d.startswith("-"):
        raise DestinationError(f"SSH destination {text!r}: {form}")
    user: Optional[str] = None
    if "@" in d:
        user, d = d.rsplit("@", 1)
        if not _USER_RE.fullmatch(user):
            raise DestinationError(f"SSH destination {text!r}: user {user!r} is not a user name; {form}")
    port: Optional[int] = None
    if d.startswith("["):
        host, sep, rest = d[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise DestinationError(f"SSH destination {text!r}: an IPv6 address goes in brackets, [fd00::1]:22")
        port_text = rest[1:] if rest else None
    elif d.count(":") > 1:
        host, port_text = d, None  # a bare IPv6 address
    else:
        host, _, port_text = d.partition(":")
        port_text = port_text if ":" in d else None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise DestinationError(f"SSH destination {text!r}: port {port_text!r} is not 1–65535")
        port = int(port_text)
    if not host:
        raise DestinationError(f"SSH destination {text!r} names no host; {form}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_LABEL_RE.fullmatch(x) for x in labels):
            raise DestinationError(f"SSH destination {text!r}: {host!r} is neither a host name nor an IP "
                                   f"address; {form}") from None
    return user, host, port


#: the port of a Ray head's GCS when ``ray start --head`` is given none
#: (``ray_constants.DEFAULT_PORT``, ray-project/ray python/ray/_private/ray_constants.py; the
#: port of vLLM's examples/online_serving/run_cluster.sh)
RAY_PORT = 6379


def parse_ray_address(text: str, where: str = "ray_address") -> tuple[str, int]:
    """An existing Ray cluster's address ``HOST:PORT`` (the head's GCS, what ``ray start
    --address`` and ``RAY_ADDRESS`` take) → ``(host, port)``; ``host`` a host name, an IPv4
    address or an IPv6 address in brackets. Raises ValueError naming ``where`` and the form."""
    form = f"give the Ray head's HOST:PORT (ray start --head --port, default {RAY_PORT}), e.g. 10.0.0.11:{RAY_PORT}"
    d = str(text).strip()
    if not d or "@" in d or "://" in d:
        raise ValueError(f"{where} {text!r}: {form}")
    try:
        _, host, port = parse_destination(d)
    except DestinationError:
        raise ValueError(f"{where} {text!r}: {form}") from None
    if port is None:
        raise ValueError(f"{where} {text!r} names no port: {form}")
    return host, port


class Host(BaseModel):
    """One machine of a rig.

    ``ssh``: the SSH destination ``user@host[:port]`` (``localhost``: this machine, no
    SSH). ``python``: the vLLM interpreter there (None: found there as on this machine,
    app.server.interpreter). ``gpus``: the cards to use there — a list of CUDA indices,
    an int N (the first N) or None (all). ``dyno``: the command that runs vLLM Dyno
    there (a program and its first arguments, shell words; the agent runs as
    ``<dyno> agent``). ``address``: where the other hosts and the app reach this host's
    servers (the private interface; default the SSH host). ``link``: the host's network to
    the other hosts, a name of the link catalog (``10gbe``, ``25gbe``, ``100gbe``,
    ``ib-hdr200``, ``ib-ndr400``; app.planner.gpus.lookup_link) that the planner and the
    sim model the inter-host traffic with (None: not given)."""

    model_config = ConfigDict(extra="forbid")

    ssh: str = LOCALHOST
    python: Optional[str] = None
    gpus: Union[list[int], int, None] = None
    dyno: str = "vllm-dyno"
    address: Optional[str] = None
    link: Optional[str] = None

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"ssh": data}
        if isinstance(data, dict):
            for k in data:
                why = secret_key_problem(k)
                if why:
                    raise ValueError(f"{k}: {why}")
        return data

    @field_validator("ssh")
    @classmethod
    def _ssh(cls, v: str) -> str:
        try:
            parse_destination(v)
        except DestinationError as e:
            raise ValueError(str(e)) from None
        return v.strip()

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: Union[list[int], int, None]) -> Union[list[int], int, None]:
        if isinstance(v, bool) or (isinstance(v, int) and v < 1):
            raise ValueError(f"gpus={v!r}: give a count ≥ 1 (first N cards) or a list of indices")
        if isinstance(v, list) and (any(i < 0 for i in v) or len(set(v)) != len(v)):
            raise ValueError(f"gpus={v}: indices are distinct and ≥ 0, as nvidia-smi lists them")
        return v

    @field_validator("link")
    @classmethod
    def _link(cls, v: Optional[str]) -> Optional[str]:
        return link_name(v)

    @field_validator("dyno")
    @classmethod
    def _dyno(cls, v: str) -> str:
        try:
            words = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"dyno {v!r}: {e}; give the command that runs vllm-dyno there") from None
        if not words:
            raise ValueError("dyno is empty: give the command that runs vllm-dyno there, e.g. vllm-dyno")
        return v

    # ------------------------------------------------------------------ views
    @property
    def user(self) -> Optional[str]:
        return parse_destination(self.ssh)[0]

    @property
    def hostname(self) -> str:
        """The host part of the destination (a name or an address)."""
        return parse_destination(self.ssh)[1]

    @property
    def port(self) -> int:
        """The SSH port (22 when the destination gives none)."""
        return parse_destination(self.ssh)[2] or SSH_PORT

    @property
    def is_local(self) -> bool:
        """True for this machine itself (``localhost``, 127.0.0.1, ::1 without a user or
        port): its agent runs as a local process, without SSH."""
        user, host, port = parse_destination(self.ssh)
        return host in LOCAL_NAMES and user is None and port is None

    @property
    def reach(self) -> str:
        """The address the app and the other hosts reach this host's servers at."""
        return self.address or ("127.0.0.1" if self.is_local else self.hostname)

    def gpu_indices(self) -> list[int] | None:
        """``gpus`` as CUDA indices: an int N → ``[0 … N-1]``; None → all."""
        if isinstance(self.gpus, int):
            return list(range(self.gpus))
        return None if self.gpus is None else list(self.gpus)

    def agent_command(self) -> str:
        """The remote command line that starts the agent: ``<dyno> agent`` (shell words
        re-quoted, so the SSH server's shell sees exactly them)."""
        return shlex.join(shlex.split(self.dyno) + ["agent"])

    def label(self) -> str:
        """How messages name this host: its destination."""
        return self.ssh


def hosts_from(data: Any) -> list[Host]:
    """A ``hosts:`` value (a list of mappings or destinations) as validated hosts; errors
    name ``hosts[i]``. Raises ValueError."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValueError("hosts: a list of hosts, each a mapping with ssh: user@host[:port]")
    out = []
    secret = hosts_secret_problem(data)
    if secret:
        raise ValueError(f"{secret[0]}: {secret[1]}")
    for i, item in enumerate(data):
        try:
            out.append(item if isinstance(item, Host) else Host.model_validate(item))
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            errs = getattr(e, "errors", None)
            msg = errs()[0]["msg"].removeprefix("Value error, ") if callable(errs) else str(e)
            loc = [str(x) for x in (errs()[0]["loc"] if callable(errs) else ())]
            where = f"hosts[{i}]" + (f".{loc[0]}" if loc else "")
            raise ValueError(f"{where}: {msg}") from None
    seen: dict[tuple[str, int], int] = {}
    for i, h in enumerate(out):
        key = (h.hostname, h.port)
        if key in seen:
            raise ValueError(f"hosts[{i}]: {h.ssh} is the same machine as hosts[{seen[key]}]; name each host once")
        seen[key] = i
    return out


def rig_link(hosts: list[Host]) -> LinkSpec | None:
    """The link the rig's inter-host traffic goes over: of the links its hosts name, the
    one of lowest bandwidth (a ring or a stage send is as fast as its slowest hop); None
    when no host names one."""
    links = [lookup_link(h.link) for h in hosts if h.link]
    return min(links, key=lambda x: x.bandwidth_gbs, default=None)
