"""A small SSH server for the multi-host test bed (tests/netns.py): asyncssh's own server,
run inside a network namespace as one "host" of a rig.

It accepts public-key authentication only (the keys of ``--authorized-keys``), runs each
exec request as ``/bin/sh -c COMMAND`` in ``--cwd`` with the server's environment, and
pumps the channel to the command's stdin/stdout/stderr as OpenSSH's sshd does without a
terminal: when the channel closes or the connection is lost, the command's stdin is
closed (the command sees EOF; it is not signalled). A client that stops answering
keepalives (1 s × 2, as sshd's ClientAliveInterval/ClientAliveCountMax) counts as gone.
Prints ``listening HOST PORT`` on
stdout once it accepts connections.
"""
from __future__ import annotations

import argparse
import asyncio
import sys

import asyncssh


async def _pump_in(process: asyncssh.SSHServerProcess, local: asyncio.subprocess.Process) -> None:
    try:
        while True:
            data = await process.stdin.read(65536)
            if not data:
                break
            local.stdin.write(data)
            await local.stdin.drain()
    except (asyncssh.Error, OSError, asyncio.CancelledError):
        pass
    finally:
        if not local.stdin.is_closing():
            local.stdin.close()  # EOF for the command: the channel is gone


async def _pump_out(reader: asyncio.StreamReader, writer) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
    except (asyncssh.Error, OSError, BrokenPipeError):
        pass


def handler(cwd: str):
    async def handle(process: asyncssh.SSHServerProcess) -> None:
        local = await asyncio.create_subprocess_shell(
            process.command or "true", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=cwd)
        pin = asyncio.ensure_future(_pump_in(process, local))
        outs = [asyncio.ensure_future(_pump_out(local.stdout, process.stdout)),
                asyncio.ensure_future(_pump_out(local.stderr, process.stderr))]
        process.channel.get_connection().dyno_pumps.append(pin)  # cancelled when the connection is lost
        rc = await local.wait()
        await asyncio.gather(*outs, return_exceptions=True)
        pin.cancel()
        try:
            process.exit(rc if rc >= 0 else 128 - rc)
        except (asyncssh.Error, OSError):
            pass
    return handle


class Server(asyncssh.SSHServer):
    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        conn.dyno_pumps = []
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        for p in getattr(self.conn, "dyno_pumps", []):
            p.cancel()  # its finally closes the command's stdin


async def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host-key", required=True)
    p.add_argument("--authorized-keys", required=True)
    p.add_argument("--cwd", required=True)
    a = p.parse_args(argv)
    server = await asyncssh.create_server(Server, a.listen, a.port, server_host_keys=[a.host_key],
                                          authorized_client_keys=a.authorized_keys, password_auth=False,
                                          kbdint_auth=False, process_factory=handler(a.cwd), encoding=None,
                                          keepalive_interval=1.0, keepalive_count_max=2)
    print(f"listening {a.listen} {a.port}", flush=True)
    async with server:
        await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1:]))
    except KeyboardInterrupt:
        pass
