"""The README's Django subsection as a user runs it: `django-admin startproject shop`,
`manage.py startapp payments`, the README's files verbatim (only the stores' addresses
replaced by the session's Redis and a fresh PostgreSQL database), `makemigrations`,
`migrate`, one real `celery -A shop worker` (prefork, two processes), and client processes
(`client.py`, run with the project on `sys.path`) whose findings are asserted here: rows in
the project's database and values the tasks returned.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, make_url

from tests.support import ROOT, Services, scratch_database

HEADING = "\n### Django\n"
SNIPPET_BROKER = "redis://localhost:6379/0"
SNIPPET_GUARD_STATE = "redis://localhost:6379/1"
#: Redis databases of this module's project: apart from the suite's (0, 1).
BROKER_DB, GUARD_STATE_DB = 7, 8
SESSION_VARIABLES = ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "LOCKS_DATABASE_URL",
                     "REDLOCK_URLS", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "JOBS_IMPORTS")
BIN = Path(sys.executable).parent

#: The test's own tasks (not the README's): a retry after a write, a crash mid-body, the
#: argument types, and `@unique`; loaded by the worker with `-I payments.chaos_tasks`.
CHAOS_TASKS = '''
import os
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from uuid import UUID

from celery import shared_task

from payments.models import Payment
from resilience.idempotency import idempotent, unique
from resilience.retry import retry_policy, wait_full_jitter


@shared_task
@idempotent(key="{order_id}", transactional=True)
@retry_policy(max_attempts=3, backoff=wait_full_jitter(base=0.1), budget=None)
def flaky(order_id: UUID, marker: str) -> int:
    payment = Payment.objects.create(order_id=order_id, amount=Decimal("1.00"))
    if not os.path.exists(marker):
        Path(marker).touch()  # the first attempt wrote its row, then fails retryably
        raise ConnectionError("the vendor hung up")
    return payment.pk


@shared_task
@idempotent(key="{order_id}", transactional=True, lease_seconds=2, poll_seconds=0.5)
def crashy(order_id: UUID, pid_file: str) -> int:
    payment = Payment.objects.create(order_id=order_id, amount=Decimal("2.00"))
    if not os.path.exists(pid_file):
        Path(pid_file).write_text(str(os.getpid()))  # written; now wait to be killed
        time.sleep(60)
    return payment.pk


@shared_task
@idempotent(key="{order_id}")
def guarded_types(order_id: UUID, when: datetime, amount: Decimal) -> list:
    return [type(order_id).__name__, type(when).__name__, type(amount).__name__,
            str(order_id), when.isoformat(), str(amount)]


@shared_task
def plain_types(order_id: UUID, when: datetime, amount: Decimal) -> list:
    return [type(order_id).__name__, type(when).__name__, type(amount).__name__,
            str(order_id), when.isoformat(), str(amount)]


@shared_task
@unique(key="{order_id}", mode="until_finished")
def ship(order_id: UUID) -> None:
    time.sleep(1)
'''

#: The project's own tests (`manage.py test payments`): Django's test database, a
#: TransactionTestCase (a TestCase's outer transaction would hold the record's row lock).
PROJECT_TESTS = '''
from decimal import Decimal
from uuid import uuid4

from django.db import connection
from django.test import TransactionTestCase

from payments.models import Payment
from payments.tasks import charge


class ChargeTest(TransactionTestCase):
    def test_a_duplicate_is_replayed_in_the_test_database(self):
        assert connection.settings_dict["NAME"].startswith("test_")
        order_id = uuid4()
        first = charge.apply(args=(order_id, Decimal("5.00"))).get()
        second = charge.apply(args=(order_id, Decimal("5.00"))).get()
        self.assertEqual(first, second)
        self.assertEqual(Payment.objects.filter(order_id=order_id).count(), 1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM resilience_idempotency_records WHERE key = %s",
                           [str(order_id)])
            self.assertEqual(cursor.fetchall(), [("succeeded",)])
'''

#: The client process: `python client.py <scenario> <args...>` prints one JSON line.
CLIENT = '''
import json
import os
import signal
import sys
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
import django

django.setup()

from django.db import transaction

from payments import chaos_tasks
from payments.models import Payment
from payments.tasks import charge


def rows(order_id):
    return Payment.objects.filter(order_id=order_id).count()


def duplicates():
    order_id = uuid.uuid4()
    results = [charge.delay(order_id, Decimal("9.99")) for _ in range(3)]
    values = [result.get(timeout=30) for result in results]
    pk = Payment.objects.get(order_id=order_id).pk
    return {"rows": rows(order_id), "values": values, "pk": pk,
            "amount": str(Payment.objects.get(order_id=order_id).amount)}


def retry(directory):
    order_id = uuid.uuid4()
    marker = os.path.join(directory, f"{order_id}.failed")
    value = chaos_tasks.flaky.delay(order_id, marker).get(timeout=30)
    return {"rows": rows(order_id), "value": value, "first_failed": os.path.exists(marker),
            "pk": Payment.objects.get(order_id=order_id).pk}


def crash(directory):
    order_id = uuid.uuid4()
    pid_file = Path(directory, f"{order_id}.pid")
    result = chaos_tasks.crashy.delay(order_id, str(pid_file))
    deadline = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the body never started"
        time.sleep(0.05)
    time.sleep(0.3)  # the row is written (uncommitted) before the pid file
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    value = result.get(timeout=40)
    return {"rows": rows(order_id), "value": value,
            "pk": Payment.objects.get(order_id=order_id).pk}


def types():
    order_id, amount = uuid.uuid4(), Decimal("12.34")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    return {
        "guarded": chaos_tasks.guarded_types.delay(order_id, when, amount).get(timeout=20),
        "plain": chaos_tasks.plain_types.delay(order_id, when, amount).get(timeout=20),
        "charged": charge.delay(order_id, amount).get(timeout=20),
        "amount": str(Payment.objects.get(order_id=order_id).amount),
        "expected": [str(order_id), when.isoformat(), str(amount)],
    }


def unique():
    order_id = uuid.uuid4()
    first = chaos_tasks.ship.delay(order_id)
    second = chaos_tasks.ship.delay(order_id)
    return {"ids": [first.id, second.id]}


def on_commit():
    committed, rolled_back = uuid.uuid4(), uuid.uuid4()
    with transaction.atomic():
        charge.delay_on_commit(committed, Decimal("3.00"))
        time.sleep(1.5)  # a published job would have run by now
        before_commit = rows(committed)
    deadline = time.monotonic() + 20
    while rows(committed) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    after_commit = rows(committed)
    try:
        with transaction.atomic():
            charge.delay_on_commit(rolled_back, Decimal("4.00"))
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    time.sleep(2)
    return {"before_commit": before_commit, "after_commit": after_commit,
            "after_rollback": rows(rolled_back),
            "has_delay_on_commit": hasattr(charge, "delay_on_commit")}


scenario = globals()[sys.argv[1]]
print(json.dumps(scenario(*sys.argv[2:])))
'''


def section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(HEADING)
    end = readme.find("\n## ", start)
    return readme[start:end if end != -1 else None]


def blocks() -> tuple[dict[str, str], list[str]]:
    """The subsection's files by their first-line comment (`# shop/celery.py`), and its
    shell blocks in order."""
    files, shells = {}, []
    for language, body in re.findall(r"```(\w+)\n(.*?)```", section(), re.S):
        if language == "sh":
            shells.append(body)
            continue
        first = body.splitlines()[0]
        assert first.startswith("# ") and "." in first, f"a block names no file: {first!r}"
        files[first[2:].strip()] = body
    return files, shells


def settings_for(snippet: str, redis_base: str, database_url: str) -> str:
    """The settings snippet on this session's stores: URLs and the DATABASES entry."""
    url = make_url(database_url)
    values = {"NAME": url.database, "USER": url.username or "", "PASSWORD": url.password or "",
              "HOST": url.host or "localhost", "PORT": str(url.port or 5432)}
    for name, value in values.items():
        snippet, count = re.subn(rf'"{name}": "[^"]*"', f'"{name}": {json.dumps(value)}',
                                 snippet)
        assert count == 1, name
    assert SNIPPET_BROKER in snippet and SNIPPET_GUARD_STATE in snippet
    return (snippet.replace(SNIPPET_BROKER, f"{redis_base}/{BROKER_DB}")
            .replace(SNIPPET_GUARD_STATE, f"{redis_base}/{GUARD_STATE_DB}"))


def user_environment(root: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in SESSION_VARIABLES}
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = str(root)
    env["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(command: list[str], root: Path, timeout: float = 60) -> str:
    done = subprocess.run(command, cwd=root, env=user_environment(root), capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def shell_line(line: str) -> list[str]:
    """A README shell line run with this interpreter (`python`, `celery`)."""
    words = shlex.split(line)
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return [str(BIN / words[0]), *words[1:]]


@dataclass
class Shop:
    root: Path
    database_url: str
    worker: subprocess.Popen[bytes]
    log: Path
    migrate_output: str
    check_output: str

    def client(self, scenario: str, *args: str, timeout: float = 60) -> dict[str, Any]:
        output = run([sys.executable, "client.py", scenario, *args], self.root, timeout)
        return json.loads(output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def database(services: Services) -> Iterator[str]:
    """A fresh database on the session's PostgreSQL, dropped after the module."""
    with scratch_database(services.database_url, "django_shop") as url:
        yield make_url(url).set(drivername="postgresql+psycopg2").render_as_string(
            hide_password=False)


@pytest.fixture(scope="module")
def shop(services: Services, database: str, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[Shop]:
    root = tmp_path_factory.mktemp("django-shop")
    files, shells = blocks()
    install, commands = shells
    assert "pip install './resilience[django]'" in install
    run([str(BIN / "django-admin"), "startproject", "shop", str(root)], root)
    run([sys.executable, "manage.py", "startapp", "payments"], root)
    for name, body in files.items():
        path = root / name
        if name == "shop/settings.py":
            with path.open("a") as settings:
                settings.write("\n" + settings_for(body, services.redis_base, database))
        else:
            path.write_text(body)
    (root / "payments" / "chaos_tasks.py").write_text(CHAOS_TASKS)
    (root / "client.py").write_text(CLIENT)
    (root / "payments" / "tests.py").write_text(PROJECT_TESTS)
    run([sys.executable, "manage.py", "makemigrations", "payments"], root)
    check_output = run([sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
                       root)
    migrate, worker = (line.strip() for line in commands.strip().splitlines())
    migrate_output = run(shell_line(migrate), root, timeout=120)
    log = root / "worker.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*shell_line(worker), "-c", "2", "-P", "prefork", "-I", "payments.chaos_tasks",
             "-n", f"shop-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle",
             "--loglevel", "INFO"],
            cwd=root, env=user_environment(root), stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 40
        while b" ready." not in log.read_bytes():
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield Shop(root, database, process, log, migrate_output, check_output)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


class TestDjangoProject:
    def test_migrate_creates_the_library_tables_and_makemigrations_has_nothing_to_do(
        self, shop: Shop
    ) -> None:
        """`manage.py migrate` applies `resilience.0001_initial`, which creates the
        library's `resilience_*` tables beside the project's; `makemigrations --check`
        finds no change (the app carries its migration)."""
        assert "Applying resilience.0001_initial... OK" in shop.migrate_output
        assert "No changes detected" in shop.check_output
        engine = create_engine(shop.database_url)
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert {"payments_payment", "resilience_idempotency_records",
                "resilience_alembic_version"} <= tables

    def test_the_projects_own_tests_run_on_djangos_test_database(self, shop: Shop) -> None:
        """`manage.py test`: the migration gives the test database the library's tables,
        and the guards' records go there too (their URL is read when first used)."""
        done = subprocess.run([sys.executable, "manage.py", "test", "payments", "--noinput"],
                              cwd=shop.root, env=user_environment(shop.root),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Ran 1 test" in done.stderr

    def test_three_duplicates_write_one_row_and_answer_one_value(self, shop: Shop) -> None:
        """A transactional ORM body with no session parameter: three `.delay()` of one
        key make one Payment row, and every `.get()` answers its id."""
        found = shop.client("duplicates")
        assert found["rows"] == 1
        assert found["values"] == [found["pk"]] * 3
        assert found["amount"] == "9.99"

    def test_a_retry_after_the_body_wrote_leaves_one_row(self, shop: Shop) -> None:
        """The first attempt writes its row and fails retryably: that row is rolled back
        with the claim, the retry writes the only row."""
        found = shop.client("retry", str(shop.root))
        assert found["first_failed"] is True
        assert found["rows"] == 1
        assert found["value"] == found["pk"]

    def test_a_pool_process_killed_after_its_write_leaves_one_row(self, shop: Shop) -> None:
        """SIGKILL of the pool process between the ORM write and the return: its
        transaction dies with it, the message comes back (acks_late,
        reject_on_worker_lost), and the redelivery writes the only row."""
        found = shop.client("crash", str(shop.root))
        assert found["rows"] == 1
        assert found["value"] == found["pk"]
        assert shop.worker.poll() is None  # the worker replaced its pool process

    def test_uuid_datetime_and_decimal_arguments_are_accepted(self, shop: Shop) -> None:
        """Celery's JSON carries UUID, datetime and Decimal: guarded and plain tasks get
        them back as those types."""
        found = shop.client("types")
        for answer in (found["guarded"], found["plain"]):
            assert answer[:3] == ["UUID", "datetime", "Decimal"]
            assert answer[3:] == found["expected"]
        assert isinstance(found["charged"], int)
        assert found["amount"] == "12.34"

    def test_unique_answers_one_id_for_two_quick_delays(self, shop: Shop) -> None:
        found = shop.client("unique")
        first, second = found["ids"]
        assert first == second

    def test_delay_on_commit_publishes_after_the_commit_only(self, shop: Shop) -> None:
        """A guarded task (DjangoTask mixed with GuardedTask) keeps `delay_on_commit`:
        nothing runs before the caller's commit, the job runs after it, and a rolled-back
        transaction publishes nothing."""
        found = shop.client("on_commit")
        assert found["has_delay_on_commit"] is True
        assert found["before_commit"] == 0
        assert found["after_commit"] == 1
        assert found["after_rollback"] == 0
