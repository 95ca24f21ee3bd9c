"""Redis clients for every topology (`redis_from_url`, `client_for`: one per URL and
process), the base of the Redis backends, and helpers that hide what a Cluster does
differently (`is_cluster`, `mget`, `read_hashes`). Error verdicts: `resilience.connections`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection, SentinelManagedSSLConnection

from resilience.connections import StoreBackend, on_fork
from resilience.errors import ConfigurationError
from resilience.redact import redact_url

#: URL schemes of the guard Redis: one server, a Sentinel-managed master, a Redis Cluster.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://", "rediss+sentinel://",
                 "redis+cluster://", "rediss+cluster://")


def check_redis_url(url: str, what: str = "redis_url") -> None:
    """Raise `ConfigurationError` unless `url` has a scheme `redis_from_url` accepts."""
    if not isinstance(url, str) or not url.startswith(REDIS_SCHEMES):
        raise ConfigurationError(
            f"{what} must start with redis://, rediss://, unix://, redis+sentinel:// or "
            f"redis+cluster://, got {redact_url(str(url))!r}")


def _hosts(hostlist: str, default_port: int) -> list[tuple[str, int]]:
    """`host:port[,host:port...]` (an IPv6 host in brackets) as (host, port) pairs."""
    hosts = []
    for part in (piece.strip() for piece in hostlist.split(",")):
        host, port = part, ""
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif ":" in part:
            host, _, port = part.rpartition(":")
        if not host or (port and not port.isdigit()):
            raise ConfigurationError(f"{part!r} is not host:port")
        hosts.append((host, int(port) if port else default_port))
    return hosts


def redis_from_url(url: str, **options: Any) -> Any:
    """A redis-py client for `url`, whatever the topology behind it.

    - `redis://`, `rediss://`, `unix://`: one server (`redis.Redis.from_url`).
    - `redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/<db>]`: the
      master Sentinel names for `<service>`, found again after a failover (redis-py's
      `Sentinel.master_for`). The password is the data nodes'; a password for the
      Sentinels themselves goes in `?sentinel_password=...`. Default port 26379.
    - `redis+cluster://[[user]:password@]host:port[,host:port...]`: a Redis Cluster
      (`redis.cluster.RedisCluster`; any reachable node discovers the rest). Default
      port 6379. Guard keys carry hash tags, so every script's keys share a slot.

    `rediss+...` connect with TLS. `options` are redis-py's, and
    `hold_after_timeout_seconds` (not for a Cluster, whose nodes fail one by one): after a
    timeout every call fails at once for that long (`UnreachableHold`).

    Raises:
        ConfigurationError: the URL is malformed (no hosts, no Sentinel service name).
    """
    check_redis_url(url)
    scheme = url.split("://", 1)[0]
    hold_seconds = options.pop("hold_after_timeout_seconds", None)
    hold = UnreachableHold(hold_seconds, redact_url(url)) if hold_seconds else None
    if "+" not in scheme:
        if hold is not None:
            base = (redis.UnixDomainSocketConnection if scheme == "unix"
                    else redis.SSLConnection if scheme == "rediss"
                    else redis.Connection)
            options["connection_class"] = _holding(base, hold)
        return redis.Redis.from_url(url, **options)
    parts = urlsplit(url)
    # urlsplit cannot parse a host list for a port: take the netloc apart by hand.
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    if not hostlist:
        raise ConfigurationError(f"{redact_url(url)!r} names no host")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    if scheme.startswith("rediss"):
        options["ssl"] = True
    if username:
        options["username"] = unquote(username)
    if password:
        options["password"] = unquote(password)
    if scheme.endswith("+cluster"):
        options.pop("health_check_interval", None)  # per-node pools check on their own
        # redis-py retries CLUSTERDOWN / an uncovered slot 10 times, each after 0.25 s and a
        # re-read of the layout: a guard call would stall ~4 s (14 s for one task's guards)
        # while a master is down. One retry rides out a blip; beyond that the guard's own
        # store-down policy decides at once.
        if "retry" not in options:
            options["retry"] = Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.25), 1)
        nodes = [ClusterNode(host, port) for host, port in _hosts(hostlist, 6379)]
        return RedisCluster(startup_nodes=nodes, **options)
    path = [segment for segment in parts.path.split("/") if segment]
    if not path:
        raise ConfigurationError(
            f"{redact_url(url)!r} names no Sentinel service: "
            "redis+sentinel://host:26379[,host:26379...]/<service_name>[/<db>]")
    service = unquote(path[0])
    if len(path) > 1:
        try:
            options["db"] = int(path[1])
        except ValueError:
            raise ConfigurationError(f"{redact_url(url)!r}: {path[1]!r} is no db number") from None
    sentinel_options = {key: options[key] for key in ("socket_timeout", "socket_connect_timeout",
                                                      "ssl") if key in options}
    if query.get("sentinel_password"):
        sentinel_options["password"] = query["sentinel_password"]
    sentinel = Sentinel(_hosts(hostlist, 26379), sentinel_kwargs=sentinel_options, **options)
    if hold is not None:
        options["connection_class"] = _holding(
            SentinelManagedSSLConnection if options.get("ssl") else SentinelManagedConnection,
            hold)
    return sentinel.master_for(service, **options)


class UnreachableHold:
    """One client's memory of its last timeout: its calls then fail at once for
    `hold_seconds` (a partitioned server would make each wait out the full timeout again);
    an answer clears it. `server` is the redacted URL, for the message."""

    def __init__(self, hold_seconds: float, server: str) -> None:
        self.hold_seconds = float(hold_seconds)
        self.server = server
        self._timed_out_at: float | None = None

    def check(self) -> None:
        """Raise redis-py's `TimeoutError` while the hold lasts (no network touched)."""
        timed_out_at = self._timed_out_at
        if timed_out_at is None:
            return
        ago = time.monotonic() - timed_out_at
        if ago < self.hold_seconds:
            raise RedisTimeoutError(
                f"{self.server} timed out {ago:.1f}s ago; its calls fail at once for "
                f"{self.hold_seconds:g}s after a timeout (resilience_socket_timeout_seconds)")

    def timed_out(self) -> None:
        self._timed_out_at = time.monotonic()

    def answered(self) -> None:
        if self._timed_out_at is not None:
            self._timed_out_at = None


def _holding(base: type, hold: UnreachableHold) -> type:
    """`base` (a redis-py connection class) whose instances share `hold`."""
    class HoldingConnection(base):  # type: ignore[misc,valid-type]
        def connect(self, *args: Any, **kwargs: Any) -> Any:
            hold.check()
            try:
                return super().connect(*args, **kwargs)
            except RedisTimeoutError:
                hold.timed_out()
                raise

        def send_packed_command(self, *args: Any, **kwargs: Any) -> Any:
            hold.check()  # a pooled connection still open would wait out its own timeout
            return super().send_packed_command(*args, **kwargs)

        def read_response(self, *args: Any, **kwargs: Any) -> Any:
            try:
                response = super().read_response(*args, **kwargs)
            except RedisTimeoutError:
                hold.timed_out()
                raise
            hold.answered()
            return response

    HoldingConnection.__name__ = HoldingConnection.__qualname__ = f"Holding{base.__name__}"
    return HoldingConnection


class RedisStoreBackend(StoreBackend):
    """A `StoreBackend` on Redis, built on a client or on a callable returning the
    process's client (fork-safe: `Stores.redis`), asked again at each use."""

    def __init__(self, client: redis.Redis | Callable[[], redis.Redis]) -> None:
        self._client = client

    @property
    def client(self) -> redis.Redis:
        return self._client() if callable(self._client) else self._client  # type: ignore[return-value]


_clients: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
_clients_lock = threading.Lock()


def client_for(url: str, **options: Any) -> Any:
    """This process's client for `url` with `options` (`redis_from_url`'s, hashable), made
    on first use: callers naming the same nodes share their pools."""
    key = (url, tuple(sorted(options.items())))
    found = _clients.get(key)
    if found is None:
        with _clients_lock:
            found = _clients.get(key)
            if found is None:
                found = _clients[key] = redis_from_url(url, **options)
    return found


def _forget_clients() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()  # a parent's thread may have held it at the fork
    _clients.clear()  # the parent's sockets stay the parent's


on_fork(_forget_clients)


def is_cluster(client: Any) -> bool:
    """Whether `client` is a `RedisCluster` (multi-key commands and pipelines per master)."""
    return isinstance(client, RedisCluster)


def mget(client: Any, keys: Sequence[str]) -> list[Any]:
    """The values of `keys` (None where missing): one MGET, or on a Cluster one per slot
    (`mget_nonatomic`)."""
    if is_cluster(client):
        return list(client.mget_nonatomic(list(keys)))
    return list(client.mget(list(keys)))


def read_hashes(client: Any, keys: Sequence[str]) -> tuple[int, list[dict[str, str]]]:
    """Redis server time in ms and the fields of each hash of `keys`, in one round trip. A
    Cluster pipeline refuses TIME (no key, no slot): the clock is read first there."""
    if is_cluster(client):
        seconds, micros = client.time()
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            hashes = pipe.execute() if keys else []
        return int(seconds) * 1000 + int(micros) // 1000, list(hashes)
    with client.pipeline(transaction=False) as pipe:
        pipe.time()
        for key in keys:
            pipe.hgetall(key)
        (seconds, micros), *hashes = pipe.execute()
    return int(seconds) * 1000 + int(micros) // 1000, hashes
