"""docker-compose.yml stays consistent with the tier configuration (no Docker engine here)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from jobs.settings import Settings, load_settings
from jobs.tiers import TIERS
from tests.support import ROOT


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in service["environment"].items()}


class TestCompose:
    def test_one_worker_service_per_tier(self, compose: dict[str, Any]) -> None:
        """Each tier has exactly one worker service, running that tier's queue."""
        workers = {
            name: service for name, service in compose["services"].items()
            if service.get("command", [None, None])[:2] == ["jobs", "worker"]
        }
        assert sorted(service["command"][2] for service in workers.values()) == sorted(TIERS)
        for name, service in workers.items():
            tier = service["command"][2]
            assert name == f"worker-{tier}"
            assert f"{tier}@" in service["healthcheck"]["test"][1], "health pings its own tier"

    def test_services_the_platform_needs_exist_with_healthchecks(
        self, compose: dict[str, Any]
    ) -> None:
        services = compose["services"]
        for name in ("redis", "redlock1", "redlock2", "redlock3", "postgres", "beat", "flower"):
            assert name in services, name
        for name in ("redis", "redlock1", "redlock2", "redlock3", "postgres", "flower"):
            assert "healthcheck" in services[name], name

    def test_environment_is_valid_platform_configuration(self, compose: dict[str, Any]) -> None:
        """The variables compose sets load as Settings, with the same tiers and URLs."""
        for name, service in compose["services"].items():
            if "environment" not in service or "build" not in service:
                continue
            env = {
                key: re.sub(r"\$\{(\w+):[-?][^}]*\}", "secret", value)
                for key, value in _env(service).items()
            }
            if "FLOWER_BASIC_AUTH" in env:
                # The operator supplies user:password at `docker compose up` (`:?` refuses
                # to start without it); stand in a well-formed one.
                env["FLOWER_BASIC_AUTH"] = "ops:secret"
            settings: Settings = load_settings(
                _env_file=None,
                **{"redis_url": env["REDIS_URL"], "database_url": env["DATABASE_URL"],
                   "broker_url": env["BROKER_URL"], "redlock_urls": env["REDLOCK_URLS"],
                   "flower_address": env.get("JOBS_FLOWER_ADDRESS", "127.0.0.1"),
                   "flower_basic_auth": env.get("FLOWER_BASIC_AUTH"),
                   **{tier: {"concurrency": int(env[f"JOBS_{tier.upper()}__CONCURRENCY"])}
                      for tier in TIERS}},
            )
            assert len(settings.redlock_urls) >= 3, name
            hosts = {url.split("//")[1].split(":")[0] for url in settings.redlock_urls}
            assert hosts <= set(compose["services"]), f"{name}: Redlock URLs name unknown services"
            for key in env:
                if key.startswith("JOBS_"):
                    field = key.removeprefix("JOBS_").split("__")[0].lower()
                    assert field in Settings.model_fields, f"{name}: {key} is not a setting"

    def test_flower_requires_auth_in_compose(self, compose: dict[str, Any]) -> None:
        flower = _env(compose["services"]["flower"])
        assert flower["JOBS_FLOWER_ADDRESS"] == "0.0.0.0"
        assert flower["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
        assert compose["services"]["flower"]["ports"] == ["127.0.0.1:5555:5555"]
