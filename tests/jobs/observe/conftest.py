"""Helpers of the observe tests: Flower and `jobs metrics` as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.embedded import free_port
from tests.support import ARTIFACTS, ROOT, wait_for


class Server:
    """A `python -m jobs ...` server subprocess on a free loopback port."""

    def __init__(self, args: list[str], port: int, env: dict[str, str], name: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / "observe" / f"{name}-{port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        full_env.pop("PYTEST_CURRENT_TEST", None)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jobs", *args], cwd=ROOT, env=full_env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def get(self, path: str, timeout_seconds: float = 10) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout_seconds) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def get_json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (status, body[:500])
        return json.loads(body)

    def wait_ready(self, path: str, timeout_seconds: float = 60) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log_tail()}")
            try:
                return self.get(path, timeout_seconds=2)[0] == 200
            except OSError:
                return False

        wait_for(answers, timeout_seconds=timeout_seconds, interval=0.25,
                 message=f"{self.url}{path}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


@pytest.fixture()
def start_server() -> Iterator[Any]:
    """Start `python -m jobs <args>` servers for one test; all are stopped afterwards."""
    started: list[Server] = []

    def start(kind: str, env: dict[str, str] | None = None) -> Server:
        port = free_port()
        if kind == "flower":
            server = Server(["flower"], port, {"JOBS_FLOWER_PORT": str(port),
                                               "FLOWER_UNAUTHENTICATED_API": "true",
                                               **(env or {})}, "flower")
            started.append(server)
            server.wait_ready("/healthcheck")
        elif kind == "metrics":
            server = Server(["metrics", "--port", str(port)], port, env or {}, "metrics")
            started.append(server)
            server.wait_ready("/metrics")
        else:
            raise ValueError(kind)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def flower(app: Any) -> Iterator[Server]:
    """One loopback Flower (no auth) shared by the page tests of the session (the workflow
    and schedule pages): each start costs seconds, and nothing in it belongs to one test."""
    port = free_port()
    server = Server(["flower"], port, {"JOBS_FLOWER_PORT": str(port),
                                       "FLOWER_UNAUTHENTICATED_API": "true"}, "flower-pages")
    try:
        server.wait_ready("/healthcheck")
        yield server
    finally:
        server.stop()


@pytest.fixture()
def multiproc_dir(tmp_path: Path) -> Path:
    """An empty PROMETHEUS_MULTIPROC_DIR for one test's workers and exporter."""
    path = tmp_path / "prometheus"
    path.mkdir()
    return path
