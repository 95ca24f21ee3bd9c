"""Bad configuration is refused at startup with a message that says what to change."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobs.settings import SettingsError, load_settings
from jobs.tiers import TIERS
from tests.support import ROOT


class TestSettings:
    def test_defaults_are_valid(self) -> None:
        """With nothing set, every tier has its defaults and the embedded URLs are used."""
        settings = load_settings(redis_url=None, database_url=None, broker_url=None)
        assert settings.critical.rejection_policy == "wait"
        assert settings.standard.rejection_policy == "caller_runs"
        assert settings.optional.rejection_policy == "discard"
        assert settings.embedded_redis and settings.embedded_postgres

    def test_per_tier_values_come_from_nested_environment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """JOBS_CRITICAL__CONCURRENCY changes one field and keeps the tier's other defaults."""
        monkeypatch.setenv("JOBS_CRITICAL__CONCURRENCY", "7")
        settings = load_settings()
        assert settings.critical.concurrency == 7
        assert settings.critical.rejection_policy == "wait"

    def test_pickle_is_refused(self) -> None:
        with pytest.raises(SettingsError, match="JOBS_ACCEPT_CONTENT.*only JSON"):
            load_settings(accept_content="json,pickle")

    def test_visibility_timeout_shorter_than_hard_limit_is_refused(self) -> None:
        """Redis would redeliver a running task: the message names the variable and the bound."""
        with pytest.raises(SettingsError, match="JOBS_VISIBILITY_TIMEOUT_SECONDS=100 is too short"):
            load_settings(
                visibility_timeout_seconds=100,
                max_countdown_seconds=10,
                standard={"hard_time_limit_seconds": 300, "soft_time_limit_seconds": 250},
            )

    def test_visibility_timeout_is_not_checked_for_rabbitmq(self) -> None:
        settings = load_settings(
            broker_url="amqp://guest:guest@127.0.0.1:5672//", visibility_timeout_seconds=10
        )
        assert not settings.broker_is_redis

    def test_expired_unacked_messages_are_looked_for_every_tenth_of_the_timeout(self) -> None:
        """kombu's sweep of a Redis broker's expired unacknowledged messages runs every tenth
        of the visibility timeout, 1 to 10 s (kombu's own default: every 100 s), and its lock
        lasts three sweeps (kombu's: 300 s)."""
        from jobs.platform import celery_config

        options = celery_config(load_settings(
            visibility_timeout_seconds=3600))["broker_transport_options"]
        assert (options["unacked_restore_interval"], options["unacked_restore_throttle"],
                options["unacked_mutex_expire"]) == (10, 1, 30)
        options = celery_config(load_settings(
            visibility_timeout_seconds=33, max_countdown_seconds=2,
            **{tier: {"soft_time_limit_seconds": 2, "hard_time_limit_seconds": 3}
               for tier in TIERS}))["broker_transport_options"]
        assert (options["unacked_restore_interval"], options["unacked_restore_throttle"],
                options["unacked_mutex_expire"]) == (3, 1, 9)

    def test_soft_limit_must_be_below_hard_limit(self) -> None:
        with pytest.raises(SettingsError, match="JOBS_OPTIONAL.*soft_time_limit_seconds"):
            load_settings(optional={"soft_time_limit_seconds": 60, "hard_time_limit_seconds": 60})

    def test_unknown_policy_is_refused(self) -> None:
        with pytest.raises(SettingsError, match="JOBS_OPTIONAL__REJECTION_POLICY"):
            load_settings(optional={"rejection_policy": "drop"})

    def test_flower_beyond_loopback_needs_a_password(self) -> None:
        with pytest.raises(SettingsError, match="FLOWER_BASIC_AUTH"):
            load_settings(flower_address="0.0.0.0")
        assert load_settings(flower_address="0.0.0.0", flower_basic_auth="ops:s3cret")

    def test_bad_urls_are_refused(self) -> None:
        with pytest.raises(SettingsError, match="REDIS_URL.*not a Redis URL"):
            load_settings(redis_url="http://localhost:6379")
        with pytest.raises(SettingsError, match="DATABASE_URL.*not a PostgreSQL URL"):
            load_settings(database_url="mysql://root@localhost/test")
        with pytest.raises(SettingsError, match="BROKER_URL"):
            load_settings(broker_url="sqs://queue")

    def test_cli_reports_bad_configuration_without_a_traceback(self) -> None:
        """`jobs config` with a dangerous environment exits 2 and prints the problem."""
        result = subprocess.run(
            [sys.executable, "-m", "jobs", "config"],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "JOBS_ACCEPT_CONTENT": "pickle"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        assert "only JSON" in result.stderr
        assert "Traceback" not in result.stderr + result.stdout

    def test_every_tier_has_defaults(self) -> None:
        settings = load_settings()
        assert [settings.tier(t).concurrency >= 1 for t in TIERS] == [True] * len(TIERS)


class TestTransactionPooling:
    def test_transaction_pooling_without_a_direct_lock_url_is_one_clear_line(self) -> None:
        """JOBS_PG_POOL_MODE=transaction alone is refused with one line naming
        LOCKS_DATABASE_URL; with it, the settings load and the stores learn the mode."""
        for mode in ("transaction", "statement"):
            with pytest.raises(SettingsError) as refused:
                load_settings(pg_pool_mode=mode)
            assert len(refused.value.problems) == 1
            assert f"JOBS_PG_POOL_MODE={mode}" in refused.value.problems[0]
            assert "LOCKS_DATABASE_URL" in refused.value.problems[0]
        settings = load_settings(
            pg_pool_mode="transaction",
            database_url="postgresql://postgres@127.0.0.1:6432/jobs",
            locks_database_url="postgresql://postgres@127.0.0.1:5432/jobs",
        )
        assert settings.effective_locks_database_url.endswith(":5432/jobs")
        from resilience.stores import Stores

        stores = Stores(redis_url="redis://127.0.0.1:6379/0",
                        database_url=settings.effective_database_url,
                        locks_database_url=settings.locks_database_url,
                        pool_mode=settings.pg_pool_mode)
        assert stores.transaction_pooled and stores.locks_pool_mode == "none"
