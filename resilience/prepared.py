"""Server-side prepared statements for the guards' hot statements.

PostgreSQL parses and plans every simple-protocol statement; for the guards' CTEs that costs
more than running them (~0.1-0.2 ms each). `PreparedStatement` keeps the SQL readable with
`%(name)s` parameters and sends `PREPARE name AS ... $n` once per connection, then
`EXECUTE name (...)`. They belong to a server session: behind a transaction (or statement)
pooler such as PgBouncer before 1.21 the next statement may run on another server
connection, where the name does not exist, so users turn them off there
(`Stores.transaction_pooled`).
"""

from __future__ import annotations

import re
from typing import Any


class PreparedStatement:
    """One statement, prepared once per connection (`PREPARE name AS ...`)."""

    def __init__(self, name: str, sql: str) -> None:
        self.name = name
        self.sql = sql
        names: list[str] = []

        def positional(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        body = re.sub(r"%\((\w+)\)s", positional, sql)
        self.names = tuple(names)
        self.prepare = f"PREPARE {name} AS {body}"
        arguments = f" ({', '.join(['%s'] * len(names))})" if names else ""
        self.execute = f"EXECUTE {name}{arguments}"
        #: PREPARE and the first EXECUTE in one round trip (one simple-protocol query; a
        #: literal `%` of the body is escaped for the driver's parameter substitution).
        self.prepare_and_execute = f"{self.prepare.replace('%', '%%')}; {self.execute}"

    def values(self, parameters: dict[str, Any]) -> list[Any]:
        """The statement's positional values from named `parameters`."""
        return [parameters[name] for name in self.names]
