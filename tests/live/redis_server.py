"""A real redis-server (Debian's package) for the tests, on an ephemeral port, with no
persistence. Without the binary the tests skip, unless GATEWAY_REQUIRE_REDIS=1, when they fail."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

REQUIRE_REDIS_ENV = "GATEWAY_REQUIRE_REDIS"


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        reason = "redis-server is not installed (Debian: apt-get install redis-server)"
        if os.environ.get(REQUIRE_REDIS_ENV) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_REDIS_ENV}=1")
        pytest.skip(reason)
    return found


def start_redis() -> RedisServer:
    binary = redis_binary()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*args, "--loglevel", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(proc, port)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(64).startswith(b"+PONG"):
                    return server
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.02)
