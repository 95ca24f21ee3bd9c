"""Settings never let Flower accept an empty password, and never echo a password they refuse."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jobs.settings import SettingsError, load_settings
from resilience.errors import ConfigurationError
from resilience.redact import redact, redact_url
from resilience.stores import Stores
from tests.support import ROOT

SECRET = "hunter2"

#: FLOWER_BASIC_AUTH values with which Flower would let an empty or missing password in.
MALFORMED_BASIC_AUTH = ["", ":", "user:", ":pw", "admin", " : ", "ops:s3cret,", "ops:s3cret,:"]

#: Every setting that holds URLs, each with a malformed value carrying SECRET as password.
BAD_URLS = {
    "REDIS_URL": f"redis//:{SECRET}@cache:6379/0",
    "JOBS_REDIS_URL": f"http://default:{SECRET}@cache:6379",
    "DATABASE_URL": f"mysql://app:{SECRET}@db/jobs",
    "BROKER_URL": f"sqs://key:{SECRET}@queue",
    "REDLOCK_URLS": f"redis://:a@n1:1/0,redis//:{SECRET}@n2:2/0,redis://:b@n3:3/0",
}

#: Variables the test session sets; a subprocess must not inherit them to see only ours.
SESSION_VARIABLES = ("REDIS_URL", "DATABASE_URL", "BROKER_URL", "REDLOCK_URLS")


def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper() in SESSION_VARIABLES or name.upper().startswith(
            ("JOBS_REDIS_URL", "JOBS_DATABASE_URL", "JOBS_BROKER_URL", "JOBS_REDLOCK_URLS",
             "FLOWER_BASIC_AUTH", "JOBS_FLOWER_")
        ):
            monkeypatch.delenv(name)


def _run(args: list[str], **variables: str) -> subprocess.CompletedProcess[str]:
    environment = {
        name: value for name, value in os.environ.items()
        if name.upper() not in SESSION_VARIABLES and not name.upper().startswith("FLOWER_")
    }
    environment.update(variables, COLUMNS="200")
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=environment, capture_output=True, text=True,
        timeout=60,  # a refused setting exits within seconds; a started server would not
    )


class TestFlowerBasicAuth:
    @pytest.mark.parametrize("value", MALFORMED_BASIC_AUTH)
    def test_malformed_value_is_refused_beyond_loopback(self, value: str) -> None:
        """An empty user or password in any pair is refused, naming the variable only."""
        with pytest.raises(SettingsError, match="FLOWER_BASIC_AUTH.*non-empty user and password"):
            load_settings(flower_address="0.0.0.0", flower_basic_auth=value)

    @pytest.mark.parametrize("value", MALFORMED_BASIC_AUTH)
    def test_malformed_value_is_refused_on_loopback(self, value: str) -> None:
        """A value that is set means a password was intended: it is refused on 127.0.0.1 too."""
        with pytest.raises(SettingsError, match="FLOWER_BASIC_AUTH"):
            load_settings(flower_address="127.0.0.1", flower_basic_auth=value)

    @pytest.mark.parametrize("variable", ["FLOWER_BASIC_AUTH", "JOBS_FLOWER_BASIC_AUTH"])
    def test_message_names_the_variable_and_never_the_value(
        self, monkeypatch: pytest.MonkeyPatch, variable: str
    ) -> None:
        """From the environment, the message names the variable that was set, not its value."""
        _clean_environment(monkeypatch)
        monkeypatch.setenv("JOBS_FLOWER_ADDRESS", "0.0.0.0")
        monkeypatch.setenv(variable, f"{SECRET}:")
        with pytest.raises(SettingsError) as refused:
            load_settings()
        assert f"  {variable}: must be user:password" in str(refused.value)
        assert SECRET not in str(refused.value)

    def test_unset_is_refused_beyond_loopback_and_allowed_on_loopback(self) -> None:
        with pytest.raises(SettingsError, match="without a password.*FLOWER_BASIC_AUTH"):
            load_settings(flower_address="::", flower_basic_auth=None)
        assert load_settings(flower_address="127.0.0.1", flower_basic_auth=None)

    @pytest.mark.parametrize("value", ["ops:s3cret", "ops:s3:cret", "ops:s3cret,viewer:pw"])
    def test_user_and_password_pairs_are_accepted(self, value: str) -> None:
        settings = load_settings(flower_address="0.0.0.0", flower_basic_auth=value)
        assert settings.flower_basic_auth is not None


class TestRedaction:
    @pytest.mark.parametrize(
        ("url", "redacted"),
        [
            (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
            (f"rediss://default:{SECRET}@cache:6380", "rediss://default:***@cache:6380"),
            (f"redis//:{SECRET}@cache", "redis//:***@cache"),
            (f"redis:/:{SECRET}@cache", "redis:/:***@cache"),
            (f"redis:{SECRET}@cache", "redis:***@cache"),
            (f"user:{SECRET}@cache", "user:***@cache"),
            (f"unix://:{SECRET}@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
            (f"unix:///run/redis.sock?db=0&password={SECRET}",
             "unix:///run/redis.sock?db=0&password=***"),
            (f"postgresql://app:{SECRET}@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
            (f"postgresql+psycopg2://app:{SECRET}@db/jobs?sslmode=require",
             "postgresql+psycopg2://app:***@db/jobs?sslmode=require"),
            (f"host=db user=app password={SECRET}", "host=db user=app password=***"),
            (f"amqp://guest:{SECRET}@mq:5672//", "amqp://guest:***@mq:5672//"),
            (f"redis://:p@ss:{SECRET}@cache", "redis://:***@cache"),
            (f"redis://:{SECRET} with space@cache", "redis://:***@cache"),
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            ("postgresql://app@db/jobs", "postgresql://app@db/jobs"),
        ],
    )
    def test_url_keeps_scheme_user_and_host(self, url: str, redacted: str) -> None:
        assert redact_url(url) == redacted

    def test_every_url_in_free_text_is_redacted(self) -> None:
        """Quoted, comma-listed and assigned URLs in one message all lose their password."""
        text = (
            f"REDIS_URL: 'redis//:{SECRET}@a' is wrong; REDLOCK_URLS=redis://:{SECRET}@n1/0,"
            f"redis://x:{SECRET}@n2/0 and DATABASE_URL=\"postgres//app:{SECRET}@db\" "
            f"(dsn password='{SECRET} x'), mail ops@example.com"
        )
        redacted = redact(text)
        assert SECRET not in redacted
        for kept in ("'redis//:***@a'", "redis://:***@n1/0,redis://x:***@n2/0",
                     '"postgres//app:***@db"', "ops@example.com"):
            assert kept in redacted

    @pytest.mark.parametrize(("variable", "value"), BAD_URLS.items())
    def test_settings_error_never_echoes_a_password(
        self, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
    ) -> None:
        """The refused URL is quoted with `***` for its password and its host kept."""
        _clean_environment(monkeypatch)
        monkeypatch.setenv(variable, value)
        with pytest.raises(SettingsError) as refused:
            load_settings()
        assert SECRET not in str(refused.value)
        assert ":***@" in str(refused.value)

    def test_stores_error_never_echoes_a_password(self) -> None:
        with pytest.raises(ConfigurationError) as refused:
            Stores(redis_url=f"http://:{SECRET}@cache", database_url="postgresql://db/jobs")
        assert SECRET not in str(refused.value) and "http://:***@cache" in str(refused.value)
        with pytest.raises(ConfigurationError) as refused:
            Stores(redis_url="redis://cache", database_url=f"mysql://app:{SECRET}@db/jobs")
        assert SECRET not in str(refused.value) and "mysql://app:***@db/jobs" in str(refused.value)

    def test_config_command_masks_a_password_in_the_query(self) -> None:
        """`jobs config` shows URLs with `?password=` masked too."""
        result = _run(["-m", "jobs", "config"],
                      REDIS_URL=f"unix:///run/redis.sock?db=0&password={SECRET}")
        assert result.returncode == 0, result.stderr
        assert "password=***" in result.stdout
        assert SECRET not in result.stdout + result.stderr


class TestVariableNames:
    @pytest.mark.parametrize("variable", ["REDIS_URL", "JOBS_REDIS_URL", "redis_url"])
    def test_error_names_the_variable_that_was_set(
        self, monkeypatch: pytest.MonkeyPatch, variable: str
    ) -> None:
        _clean_environment(monkeypatch)
        monkeypatch.setenv(variable, f"redis//:{SECRET}@cache")
        with pytest.raises(SettingsError) as refused:
            load_settings()
        assert f"  {variable}: 'redis//:***@cache' is not a Redis URL" in str(refused.value)

    def test_prefixed_variable_wins_and_is_named(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With both set, pydantic-settings reads JOBS_DATABASE_URL, so that one is named."""
        _clean_environment(monkeypatch)
        monkeypatch.setenv("DATABASE_URL", "postgresql://db/jobs")
        monkeypatch.setenv("JOBS_DATABASE_URL", "mysql://db/jobs")
        with pytest.raises(SettingsError, match=r"  JOBS_DATABASE_URL: 'mysql://db/jobs'"):
            load_settings()

    def test_value_given_in_code_is_not_blamed_on_the_environment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bad keyword override is not reported under a (valid) variable that is also set."""
        monkeypatch.setenv("JOBS_REDIS_URL", "redis://cache/0")
        with pytest.raises(SettingsError, match=r"\n  REDIS_URL: 'http://cache'"):
            load_settings(redis_url="http://cache")


class TestCeleryCommand:
    @pytest.mark.parametrize(
        ("variable", "command"),
        [
            ("JOBS_REDIS_URL", ["inspect", "ping"]),
            ("REDIS_URL", ["inspect", "ping"]),
            ("DATABASE_URL", ["worker", "-Q", "critical"]),
            ("REDLOCK_URLS", ["beat"]),
        ],
    )
    def test_bad_setting_prints_one_line(self, variable: str, command: list[str]) -> None:
        """`celery -A jobs ...` prints `jobs: <problem>` on one line, exits 2, no traceback."""
        result = _run(["-m", "celery", "-A", "jobs", *command], **{variable: BAD_URLS[variable]})
        output = result.stdout + result.stderr
        assert result.returncode == 2, output
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("jobs: "), output
        assert f" {variable}: " in result.stderr
        assert "Traceback" not in output and SECRET not in output

    def test_bad_flower_password_prints_one_line(self) -> None:
        result = _run(["-m", "celery", "-A", "jobs.app", "flower"], FLOWER_BASIC_AUTH=SECRET)
        assert result.returncode == 2
        assert result.stderr.startswith("jobs: ") and result.stderr.count("\n") == 1
        assert "FLOWER_BASIC_AUTH" in result.stderr and SECRET not in result.stderr

    def test_importing_the_app_outside_celery_still_raises(self) -> None:
        """A library or test building `jobs.app` gets SettingsError, not an exit."""
        result = _run(
            ["-c", "import jobs\ntry:\n    jobs.app\nexcept Exception as e:\n"
                   "    print(type(e).__name__)"],
            REDIS_URL=f"redis//:{SECRET}@cache",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "SettingsError"

    def test_valid_settings_load_the_app(self, services: object) -> None:
        """With the session's valid settings, `celery -A jobs report` loads the app."""
        result = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "jobs", "report"], cwd=ROOT,
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert "jobs:" not in result.stderr
