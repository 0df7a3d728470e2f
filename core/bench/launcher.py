"""A server command on a free loopback port: started, waited for until GET /health answers,
stopped, and the tail of its output shown when it does not come up. The benchmark scripts start
every server they measure with it (ours, llama.cpp, vLLM) and conformance's ServerProcess is
built on it."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

LOOPBACK = "127.0.0.1"
PORT = "{port}"  # in a command, replaced by the port chosen
TAIL_CHARS = 4000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LaunchedServer:
    """`argv` (with {port} filled in) run in a session of its own, its stdout and stderr appended
    to a log file. Stopping sends SIGTERM to the whole process group, so children such as
    vLLM's engine process stop too; stop_whole_group=False signals the command alone, for a command
    that stops its own children (`qwen-serve ray` stops the Ray cluster it started, which
    signalling the group would kill under it first)."""

    def __init__(self, argv: Sequence[str], name: str = "server", env: Mapping[str, str] | None = None,
                 startup_timeout_s: float = 120.0, stop_whole_group: bool = True, stop_timeout_s: float = 30.0) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.argv = [arg.replace(PORT, str(self.port)) for arg in argv]
        self.env = dict(env or {})  # added to ours
        self.startup_timeout_s = startup_timeout_s
        self.stop_whole_group = stop_whole_group
        self.stop_timeout_s = stop_timeout_s
        fd, log = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
        os.close(fd)
        self.log = Path(log)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None  # from start to healthy

    def start(self, ready: bool = True) -> "LaunchedServer":
        """Returns once /health answers 200, or with ready=False once it answers at all (a server
        says 503 while its model loads); stops the process and raises, with the log's tail, when
        it exits first or startup_timeout_s passes."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", **self.env)
        started = time.monotonic()
        with open(self.log, "ab") as log:  # append mode: our reads never move the child's writes
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        try:
            self._wait_for_health(started + self.startup_timeout_s, ready)
        except BaseException:  # failed or interrupted: its own session would outlive us otherwise
            self.terminate()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_for_health(self, deadline: float, ready: bool) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before answering /health\n"
                                   f"{' '.join(self.argv)}\n{self.tail()}")
            status = self.health_status()
            if status == 200 or (status is not None and not ready):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer /health within {self.startup_timeout_s:.0f} s\n"
                           f"{' '.join(self.argv)}\n{self.tail()}")

    def health_status(self) -> int | None:
        """The status GET /health answers with, None while nothing answers."""
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def stop(self) -> None:
        self.terminate()

    def terminate(self) -> None:
        """SIGTERM, then SIGKILL after stop_timeout_s; nothing when it has already exited."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=self.stop_timeout_s)

    def _signal(self, sig: int) -> None:
        if self.stop_whole_group:
            os.killpg(self.proc.pid, sig)  # our own child's process group
        else:
            self.proc.send_signal(sig)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the server printed so far (stdout and stderr)."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def tail(self, chars: int = TAIL_CHARS) -> str:
        return self.output()[-chars:]

    def __enter__(self) -> "LaunchedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
