"""Lua scripts of the guards: read once from `.lua` files, registered once per Redis client.

Each guard's atomic step is a Lua script in a `.lua` file next to the module that runs it,
opening with its contract comment (`-- KEYS[1] = ...`, `-- ARGV[1] = ...`). The module loads
it at import, as Dramatiq loads its `.lua` files once::

    GCRA = LuaScript.load(__file__, "gcra.lua")
    allowed, retry, now = GCRA(client, keys=[key, waiting], args=[...])

A call sends EVALSHA; a server that does not know the script (first use, restart,
`SCRIPT FLUSH`) gets it loaded and the call retried, by redis-py's `Script`. `for_client`
gives that `Script` itself, for `resilience.batch.RedisBatch.script` (which needs its `.sha`
and calls it again on NOSCRIPT).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script


@dataclass(frozen=True)
class LuaScript:
    """One Lua script, addressed by the SHA1 of its text; its redis-py `Script` is cached per
    client.

    The cache holds clients weakly and by identity, so a client that was garbage collected
    (and whose `id()` a new client may reuse) never hands its entry to another client.
    """

    name: str
    text: str
    sha: str = field(init=False)
    _by_client: weakref.WeakKeyDictionary[Any, Script] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.text.encode()).hexdigest())

    @classmethod
    def load(cls, module_file: str, filename: str) -> LuaScript:
        """The script in `filename`, a file next to `module_file` (pass `__file__`).

        Raises:
            OSError: the file is missing or unreadable (at import, not on first call).
        """
        path = Path(module_file).with_name(filename)
        return cls(name=path.stem, text=path.read_text(encoding="utf-8"))

    def for_client(self, client: redis.Redis) -> Script:
        """This script registered on `client` (created on first use; no round trip)."""
        script = self._by_client.get(client)
        if script is None:
            # Two threads may both create one; either is correct and one of them is kept.
            script = self._by_client[client] = client.register_script(self.text)
        return script

    def __call__(self, client: redis.Redis, keys: Sequence[Any] = (),
                 args: Sequence[Any] = ()) -> Any:
        """Run the script on `client` (EVALSHA, loading it on NOSCRIPT); its reply.

        Raises:
            redis.exceptions.RedisError: as the client raises it (a backend's methods
                translate it: `resilience.connections.StoreBackend`).
        """
        return self.for_client(client)(keys=keys, args=args)
