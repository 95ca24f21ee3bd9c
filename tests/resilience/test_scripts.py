"""Lua scripts: read once, registered once per Redis client, reloaded when the server lost them."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import redis

import resilience
from resilience.batch import RedisBatch
from resilience.scripts import LuaScript

ECHO = """\
-- Echo for tests.
-- KEYS[1] = any key
-- ARGV[1] = any value
return ARGV[1] .. ':' .. KEYS[1]
"""


@pytest.fixture()
def echo(tmp_path: Path, redis_client: redis.Redis) -> LuaScript:
    """A script in a file next to a module, not yet known to the server."""
    (tmp_path / "echo.lua").write_text(ECHO)
    redis_client.script_flush()
    return LuaScript.load(str(tmp_path / "module.py"), "echo.lua")


@pytest.fixture()
def another_client(stores: Any) -> Any:
    """Makes more clients of the shared Redis (closed after the test)."""
    made: list[redis.Redis] = []

    def make() -> redis.Redis:
        made.append(redis.Redis.from_url(stores.redis_url, decode_responses=True))
        return made[-1]

    yield make
    for client in made:
        client.close()


def count_loads(monkeypatch: pytest.MonkeyPatch, client: redis.Redis) -> list[str]:
    """The scripts `client` sends with SCRIPT LOAD (redis-py's NOSCRIPT fallback)."""
    loads: list[str] = []
    original = client.script_load

    def script_load(text: str) -> Any:
        loads.append(text)
        return original(text)

    monkeypatch.setattr(client, "script_load", script_load)
    return loads


class TestLuaScript:
    def test_loaded_from_the_file_next_to_the_module(self, echo: LuaScript,
                                                     redis_client: redis.Redis) -> None:
        """`load` reads the file once; its SHA1 is the one Redis gives the same text."""
        assert echo.name == "echo"
        assert echo.text == ECHO
        assert redis_client.script_load(echo.text) == echo.sha

    def test_registered_once_per_client(self, echo: LuaScript, redis_client: redis.Redis,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """Calls after the first reuse the client's `Script` and send EVALSHA only."""
        loads = count_loads(monkeypatch, redis_client)
        assert echo.for_client(redis_client) is echo.for_client(redis_client)
        assert echo(redis_client, ["k"], ["a"]) == "a:k"  # first use: NOSCRIPT, loaded
        assert echo(redis_client, ["k"], ["b"]) == "b:k"
        assert echo(redis_client, keys=["k"], args=["c"]) == "c:k"
        assert loads == [ECHO]

    def test_flushed_script_is_reloaded(self, echo: LuaScript, redis_client: redis.Redis,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
        """A server that lost the script (SCRIPT FLUSH, restart) gets it again, unseen."""
        loads = count_loads(monkeypatch, redis_client)
        assert echo(redis_client, ["k"], ["a"]) == "a:k"
        redis_client.script_flush()
        assert redis_client.script_exists(echo.sha) == [False]
        assert echo(redis_client, ["k"], ["b"]) == "b:k"
        assert redis_client.script_exists(echo.sha) == [True]
        assert loads == [ECHO, ECHO]

    def test_each_client_gets_its_own(self, echo: LuaScript, redis_client: redis.Redis,
                                      another_client: Any) -> None:
        """Two clients each get a `Script` bound to themselves; both run it."""
        other = another_client()
        mine, theirs = echo.for_client(redis_client), echo.for_client(other)
        assert mine is not theirs
        assert mine.registered_client is redis_client
        assert theirs.registered_client is other
        assert echo(redis_client, ["k"], ["a"]) == "a:k"
        assert echo(other, ["k"], ["b"]) == "b:k"

    def test_collected_client_is_forgotten(self, echo: LuaScript, stores: Any) -> None:
        """A new client never gets the `Script` of a collected one, even at the same id()."""
        gone = redis.Redis.from_url(stores.redis_url, decode_responses=True)
        echo.for_client(gone)
        gone.close()
        del gone
        gc.collect()
        fresh = redis.Redis.from_url(stores.redis_url, decode_responses=True)
        try:
            assert echo.for_client(fresh).registered_client is fresh
            assert echo(fresh, ["k"], ["a"]) == "a:k"
        finally:
            fresh.close()

    def test_works_in_a_batch(self, echo: LuaScript, redis_client: redis.Redis) -> None:
        """`for_client` gives what `RedisBatch.script` takes, loaded or not on the server."""
        replies: list[Any] = []
        for value in ("a", "b"):  # first NOSCRIPT (run once more on its own), then EVALSHA
            batch = RedisBatch(redis_client)
            batch.script(echo.for_client(redis_client), ["k"], [value], then=replies.append)
            batch.execute()
        redis_client.script_flush()
        batch = RedisBatch(redis_client)
        batch.script(echo.for_client(redis_client), ["k"], ["c"], then=replies.append)
        batch.execute()
        assert replies == ["a:k", "b:k", "c:k"]

    def test_every_script_states_its_contract(self) -> None:
        """Each `.lua` file of the guards opens with its KEYS/ARGV contract comment."""
        files = sorted(Path(resilience.__file__).parent.rglob("*.lua"))
        assert files
        for path in files:
            text = path.read_text()
            assert "-- KEYS[1]" in text, path
            assert "-- ARGV[1]" in text, path
