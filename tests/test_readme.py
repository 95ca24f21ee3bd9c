"""The README stays true: the two commands, and every setting in the configuration table."""

from __future__ import annotations

from jobs.settings import Settings, TierSettings
from tests.support import ROOT

README = (ROOT / "README.md").read_text()


class TestReadme:
    def test_gives_the_two_commands(self) -> None:
        assert "make run" in README and "make test" in README

    def test_configuration_table_lists_every_setting(self) -> None:
        """A setting added to jobs/settings.py must be documented in the README table."""
        aliases = {"redis_url": "REDIS_URL", "database_url": "DATABASE_URL",
                   "broker_url": "BROKER_URL", "redlock_urls": "REDLOCK_URLS",
                   "flower_basic_auth": "FLOWER_BASIC_AUTH"}
        for name in Settings.model_fields:
            if name in TierSettings.model_fields or name in ("critical", "standard", "optional"):
                continue
            variable = aliases.get(name, f"JOBS_{name.upper()}")
            assert f"`{variable}`" in README, variable
        for name in TierSettings.model_fields:
            assert f"`JOBS_<TIER>__{name.upper()}`" in README, name
