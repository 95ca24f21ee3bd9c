"""Platform settings from the environment (pydantic-settings), validated at startup.

Every setting has the prefix `JOBS_`; the well-known URLs are also read without it
(`REDIS_URL`, `DATABASE_URL`, `BROKER_URL`, `REDLOCK_URLS`). Per-tier values are nested:
`JOBS_CRITICAL__CONCURRENCY=4`, `JOBS_OPTIONAL__MAX_QUEUE_DEPTH=500`.
"""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from jobs.tiers import CRITICAL, OPTIONAL, STANDARD, TIERS
from resilience.connections.redis import REDIS_SCHEMES
from resilience.errors import ConfigurationError
from resilience.redact import redact, redact_url

RejectionPolicy = Literal["abort", "discard", "caller_runs", "wait"]

#: Seconds of slack required between the longest hard time limit (or countdown) and the
#: broker's visibility timeout, so a task still running is never handed to a second worker.
VISIBILITY_MARGIN_SECONDS = 30


class SettingsError(ConfigurationError):
    """Raised when the environment holds an invalid or dangerous configuration."""


class TierSettings(BaseModel):
    """Worker and admission settings of one tier (the README's configuration table); the
    defaults here are every tier's, `TIER_DEFAULTS` adds each tier's own."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    concurrency: int = Field(2, ge=1, le=512)
    prefetch_multiplier: int = Field(1, ge=1, le=128)
    soft_time_limit_seconds: float = Field(gt=0)
    hard_time_limit_seconds: float = Field(gt=0)
    max_queue_depth: int = Field(10_000, ge=1)
    rejection_policy: RejectionPolicy
    wait_timeout_seconds: float = Field(5, ge=0)
    deadline_seconds: float | None = Field(None, gt=0)  # unset: never shed
    shed_queue_depth: int | None = Field(None, ge=1)  # unset: half max_queue_depth
    shed_deadline_factor: float = Field(0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _soft_below_hard(self) -> TierSettings:
        if self.soft_time_limit_seconds >= self.hard_time_limit_seconds:
            raise ValueError(
                f"soft_time_limit_seconds ({self.soft_time_limit_seconds}) must be below "
                f"hard_time_limit_seconds ({self.hard_time_limit_seconds}) so the task can "
                "clean up before it is killed")
        return self


#: Each tier's defaults (seeds: critical waits for room, standard runs in the caller,
#: optional is discarded when full; long tiers prefetch one message). Optional work is shed
#: after 10 minutes, and after 2.5 minutes while its queue is more than half full: under
#: pressure the optional tier sheds first.
TIER_DEFAULTS: dict[str, dict[str, Any]] = {
    CRITICAL: {"soft_time_limit_seconds": 25, "hard_time_limit_seconds": 30,
               "rejection_policy": "wait"},
    STANDARD: {"soft_time_limit_seconds": 110, "hard_time_limit_seconds": 120,
               "rejection_policy": "caller_runs"},
    OPTIONAL: {"soft_time_limit_seconds": 50, "hard_time_limit_seconds": 60,
               "rejection_policy": "discard", "prefetch_multiplier": 4,
               "max_queue_depth": 1_000, "wait_timeout_seconds": 0, "deadline_seconds": 600},
}

CommaList = Annotated[list[str], NoDecode]

_REDIS = (REDIS_SCHEMES, " is not a Redis URL (redis://host:port/db, "
          "redis+sentinel://host:26379/<service>, redis+cluster://host:port)")
_POSTGRES = (("postgresql", "postgres://"), " is not a PostgreSQL URL (postgresql://user@host/db)")
#: URL field -> (the schemes it accepts, what an error says after the redacted URL).
_URL_SCHEMES: dict[str, tuple[tuple[str, ...], str]] = {
    "redis_url": _REDIS, "redlock_urls": _REDIS,
    "database_url": _POSTGRES, "locks_database_url": _POSTGRES,
    "vendor_url": (("http://", "https://"), " is not an HTTP URL (http://host:port)"),
    "broker_url": (("redis://", "rediss://", "amqp://", "amqps://", "pyamqp://"),
                   ": the broker must be Redis (redis://) or RabbitMQ (amqp://)"),
}


def _aliased(variable: str, **field: Any) -> Any:
    """A field read from `JOBS_<variable>` or, a well-known name, from `<variable>` alone."""
    if "default_factory" not in field:
        field["default"] = None
    choices = AliasChoices(f"JOBS_{variable}", variable, variable.lower())
    return Field(validation_alias=choices, **field)


class Settings(BaseSettings):
    """All platform settings; see the README's configuration table."""

    model_config = SettingsConfigDict(env_prefix="JOBS_", env_nested_delimiter="__",
                                      extra="ignore", frozen=True, populate_by_name=True)

    redis_url: str | None = _aliased("REDIS_URL")  # unset: embedded Redis
    database_url: str | None = _aliased("DATABASE_URL")  # unset: embedded PostgreSQL
    broker_url: str | None = _aliased("BROKER_URL")  # unset: the Redis URL
    locks_database_url: str | None = _aliased("LOCKS_DATABASE_URL")  # unset: DATABASE_URL
    result_backend_url: str | None = _aliased("RESULT_BACKEND_URL")
    redlock_urls: CommaList = _aliased("REDLOCK_URLS", default_factory=list)
    visibility_timeout_seconds: int = Field(3600, ge=10)
    max_countdown_seconds: float = Field(600, gt=0)
    accept_content: CommaList = Field(default_factory=lambda: ["json"])
    max_payload_bytes: int = Field(256 * 1024, ge=1024)
    imports: CommaList = Field(default_factory=list)
    data_dir: Path = Path(".data")
    embedded_redis_port: int = Field(16379, ge=1, le=65535)
    embedded_postgres_port: int = Field(15432, ge=1, le=65535)
    embedded_redlock_ports: CommaList = Field(default_factory=lambda: ["16380", "16381", "16382"])
    flower_address: str = "127.0.0.1"
    flower_port: int = Field(5555, ge=1, le=65535)
    flower_basic_auth: SecretStr | None = _aliased("FLOWER_BASIC_AUTH")  # user:password,...
    max_deliveries: int = Field(3, ge=1)
    dead_letter_replay_closed_seconds: float | None = Field(None, gt=0)  # unset: no replay
    dead_letter_replay_rate: str = "10/second"
    pg_pool_mode: Literal["none", "session", "transaction", "statement"] = "none"
    metrics_port: int = Field(9808, ge=1, le=65535)
    worker_stall_seconds: float = Field(60, ge=0)  # 0: off
    vendor_url: str | None = None  # unset: the simulated vendor
    vendor_port: int = Field(18090, ge=1, le=65535)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["logfmt", "json", "text"] = "logfmt"

    critical: TierSettings
    standard: TierSettings
    optional: TierSettings

    # -- validation --------------------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _tier_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):  # each tier's defaults under what was given for it
            data = {**data, **{tier: {**TIER_DEFAULTS[tier], **dict(data.get(tier) or {})}
                               for tier in TIERS if not isinstance(data.get(tier), TierSettings)}}
        return data

    @field_validator("redlock_urls", "accept_content", "imports", "embedded_redlock_ports",
                     mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("embedded_redlock_ports")
    @classmethod
    def _ports(cls, ports: list[str]) -> list[str]:
        for port in ports:
            if not str(port).isdigit():
                raise ValueError(f"ports must be numbers, got {port!r}")
        return ports

    @field_validator("accept_content")
    @classmethod
    def _json_only(cls, value: list[str]) -> list[str]:
        refused = [v for v in value if v not in ("json", "application/json")]
        if refused:
            raise ValueError(
                f"only JSON is accepted on this platform; remove {', '.join(refused)} "
                "(pickle and yaml let a message run arbitrary code in the worker)")
        return value

    @field_validator(*_URL_SCHEMES)
    @classmethod
    def _url_scheme(cls, value: Any, info: ValidationInfo) -> Any:
        schemes, problem = _URL_SCHEMES[str(info.field_name)]
        for url in value if isinstance(value, list) else [value]:
            if url is not None and not url.startswith(schemes):
                raise ValueError(f"{redact_url(url)!r}{problem}")
        return value

    @field_validator("flower_basic_auth")
    @classmethod
    def _user_and_password(cls, value: SecretStr | None) -> SecretStr | None:
        # Flower splits the value on "," and accepts a request whose decoded credentials
        # equal one entry, so an empty entry ("", "a:b,", ":") lets `Basic ==` in. Refused
        # on loopback too: a value that is set means a password was intended.
        if value is not None:
            for pair in value.get_secret_value().split(","):
                user, colon, password = pair.partition(":")
                if not (colon and user.strip() and password.strip()):
                    raise ValueError(
                        "must be user:password, or a comma list of user:password pairs, "
                        "with a non-empty user and password in every pair (value not shown)")
        return value

    @model_validator(mode="after")
    def _dangerous_combinations(self) -> Settings:
        if self.broker_is_redis:
            longest = max(self.tier(t).hard_time_limit_seconds for t in TIERS)
            longest_tier = max(TIERS, key=lambda t: self.tier(t).hard_time_limit_seconds)
            needed = max(longest, self.max_countdown_seconds) + VISIBILITY_MARGIN_SECONDS
            if self.visibility_timeout_seconds < needed:
                raise ValueError(
                    f"JOBS_VISIBILITY_TIMEOUT_SECONDS={self.visibility_timeout_seconds} is too "
                    f"short: Redis would hand a running or delayed task to a second worker. It "
                    f"must be at least {needed:g} (the longest of tier {longest_tier}'s hard "
                    f"time limit {longest:g}s and JOBS_MAX_COUNTDOWN_SECONDS="
                    f"{self.max_countdown_seconds:g}, plus {VISIBILITY_MARGIN_SECONDS}s); raise "
                    "it or lower those limits")
        if self.flower_basic_auth is None and not is_loopback(self.flower_address):
            raise ValueError(
                f"JOBS_FLOWER_ADDRESS={self.flower_address} exposes Flower beyond this machine "
                "without a password; set FLOWER_BASIC_AUTH to user:password or bind to 127.0.0.1")
        if self.pg_pool_mode in ("transaction", "statement") and not self.locks_database_url:
            raise ValueError(
                f"JOBS_PG_POOL_MODE={self.pg_pool_mode}: advisory locks (singleton guard, beat "
                "leadership) need a session of their own; set LOCKS_DATABASE_URL to PostgreSQL "
                "reached directly (docs/production.md)")
        topology = not (self.redis_url or "redis://").startswith(("redis://", "rediss://",
                                                                   "unix://"))
        if topology and not self.broker_url:
            raise ValueError(
                "REDIS_URL is a Sentinel or Cluster URL: set BROKER_URL to the broker (one "
                "Redis, redis://, or RabbitMQ, amqp://); guard state and broker are kept apart "
                "in production (docs/production.md)")
        if topology and not self.result_backend_url and not self.broker_is_redis:
            raise ValueError(
                "REDIS_URL is a Sentinel or Cluster URL and the broker is RabbitMQ: set "
                "RESULT_BACKEND_URL (a redis:// URL, or db+postgresql://...) for task results")
        if len(self.embedded_redlock_ports) < 3 and not self.redlock_urls:
            raise ValueError("JOBS_EMBEDDED_REDLOCK_PORTS needs at least 3 ports for a quorum")
        return self

    # -- derived values ----------------------------------------------------------------
    def tier(self, name: str) -> TierSettings:
        """Settings of tier `name` (validated by the caller)."""
        return getattr(self, name)

    @property
    def embedded_redis(self) -> bool:
        return self.redis_url is None

    @property
    def embedded_postgres(self) -> bool:
        return self.database_url is None

    @property
    def embedded_redlock(self) -> bool:
        return not self.redlock_urls

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or f"redis://127.0.0.1:{self.embedded_redis_port}/0"

    @property
    def effective_database_url(self) -> str:
        return (
            self.database_url
            or f"postgresql://postgres@127.0.0.1:{self.embedded_postgres_port}/jobs")

    @property
    def effective_locks_database_url(self) -> str:
        return self.locks_database_url or self.effective_database_url

    @property
    def effective_result_backend_url(self) -> str:
        if self.result_backend_url:
            return self.result_backend_url
        if self.effective_redis_url.startswith(("redis://", "rediss://", "unix://")):
            return self.effective_redis_url
        return self.effective_broker_url  # a Sentinel/Cluster guard store: the broker's Redis

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.effective_redis_url

    @property
    def effective_redlock_urls(self) -> list[str]:
        if self.redlock_urls:
            return list(self.redlock_urls)
        return [f"redis://127.0.0.1:{port}/0" for port in self.embedded_redlock_ports]

    @property
    def simulated_vendor(self) -> bool:
        """No vendor URL set: `jobs up` runs the simulated payment vendor (jobs/vendor.py)."""
        return self.vendor_url is None

    @property
    def effective_vendor_url(self) -> str:
        return (self.vendor_url or f"http://127.0.0.1:{self.vendor_port}").rstrip("/")

    @property
    def broker_is_redis(self) -> bool:
        return self.effective_broker_url.startswith(("redis://", "rediss://", "unix://"))


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP or `localhost`) is this machine's loopback."""
    try:
        return address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _env_name(location: tuple[Any, ...], overrides: dict[str, Any]) -> str:
    """The environment variable to change for the error at `location`.

    An aliased field is named by the variable the user set (REDIS_URL or JOBS_REDIS_URL):
    pydantic-settings reads the first alias present, ignoring case, and so does this search.
    """
    if not location:
        return "the configuration"
    head = str(location[0])
    for name, field in Settings.model_fields.items():
        choices = getattr(field.validation_alias, "choices", [])
        if head in (name, *choices) and not overrides.keys() & {name, *choices}:
            environ = {key.lower(): key for key in os.environ}
            for choice in choices:
                if choice.lower() in environ:
                    return environ[choice.lower()]
    parts = [str(part).upper() for part in location if not str(part).isdigit()]
    if parts[0].startswith("JOBS_") or parts[0] in ("REDIS_URL", "DATABASE_URL", "BROKER_URL",
                                                    "REDLOCK_URLS"):
        return parts[0]
    return "JOBS_" + "__".join(parts)


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings.

    Raises:
        SettingsError: one line per problem, naming the environment variable to change.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            message = redact(str(error["msg"]).removeprefix("Value error, "))
            lines.append(f"  {_env_name(tuple(error['loc']), overrides)}: {message}")
        raise SettingsError(
            "invalid platform configuration:\n" + "\n".join(lines), problems=lines
        ) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return load_settings()
