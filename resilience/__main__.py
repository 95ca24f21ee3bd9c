"""`python -m resilience`: the library's own commands (its schema).

    python -m resilience migrate -A proj             # the app's resilience_database_url
    python -m resilience migrate --database-url postgresql://app@db/shop
    python -m resilience migrate --sql               # print the SQL instead (offline)
    python -m resilience current -A proj
    python -m resilience downgrade --revision base -A proj

The database URL comes from `--database-url`, else from the Celery app's
`app.conf.resilience_database_url` (`-A module:app` or `-A module`, found as `celery -A`
finds it), else from the environment variable `RESILIENCE_DATABASE_URL`. A mistake (and a
database that cannot be reached) prints one line and exits 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from resilience import migrations
from resilience.errors import ConfigurationError, ResilienceError
from resilience.redact import redact

#: The environment variable read when neither `--database-url` nor `-A` is given.
ENVIRONMENT_VARIABLE = "RESILIENCE_DATABASE_URL"

#: Exit status of a usage or configuration mistake, or of a database that cannot serve.
USAGE_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (its usage block goes to --help)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"python -m resilience: {message} (see --help)")


class _UsageError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m resilience`."""
    main_parser = _Parser(prog="python -m resilience",
                          description="The resilience library's own schema commands.")
    commands = main_parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                          parser_class=_Parser)

    for name, help_text in (("migrate", "create or update the resilience tables"),
                            ("current", "print the applied revision"),
                            ("downgrade", "revert to a revision (base: drop every table)")):
        command = commands.add_parser(name, help=help_text)
        source = command.add_mutually_exclusive_group()
        source.add_argument("--database-url", metavar="URL",
                            help="PostgreSQL URL of the resilience tables")
        source.add_argument("-A", "--app", metavar="MODULE[:APP]",
                            help="Celery app whose conf.resilience_database_url to use")
        if name == "migrate":
            command.add_argument("--revision", default="head",
                                 help="target revision (default: head)")
            command.add_argument("--sql", action="store_true",
                                 help="print the SQL from an empty database instead of running it")
        elif name == "downgrade":
            command.add_argument("--revision", required=True,
                                 help="target revision; `base` drops every resilience table")
    return main_parser


def database_url(url: str | None, app: str | None) -> str:
    """The URL to migrate: `--database-url`, else the app's conf, else the environment.

    Raises:
        ConfigurationError: none names a URL, or the app cannot be loaded.
    """
    if url:
        return url
    if app:
        found = _load_app(app).conf.get("resilience_database_url")
        if not found:
            raise ConfigurationError(
                f"the Celery app {app!r} has no resilience_database_url (Django: "
                "CELERY_RESILIENCE_DATABASE_URL): set it, or pass --database-url URL")
        return str(found)
    found = os.environ.get(ENVIRONMENT_VARIABLE)
    if found:
        return found
    raise ConfigurationError(
        "no database to migrate: pass --database-url URL, or -A module:app (its "
        f"resilience_database_url), or set {ENVIRONMENT_VARIABLE}")


def _load_app(name: str) -> object:
    from celery import Celery
    from celery.app.utils import find_app

    sys.path.insert(0, os.getcwd())  # as `celery -A` does: the project is the cwd
    try:
        found = find_app(name)
    except Exception as exc:  # noqa: BLE001 - any import error of the user's module
        raise ConfigurationError(
            f"cannot load the Celery app {name!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(found, Celery):
        raise ConfigurationError(f"{name!r} is {type(found).__name__}, not a Celery app")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status (0, or 2: a mistake or an unreachable database)."""
    try:
        arguments = parser().parse_args(argv)
        if arguments.command == "migrate" and arguments.sql:
            url = arguments.database_url or "postgresql://"
            sys.stdout.write(migrations.sql(url, arguments.revision))
            return 0
        url = database_url(arguments.database_url, arguments.app)
        if arguments.command == "migrate":
            migrations.upgrade(url, arguments.revision)
            print(f"resilience tables at revision {migrations.current(url)}")
        elif arguments.command == "downgrade":
            migrations.downgrade(url, arguments.revision)
            print(f"resilience tables at revision {migrations.current(url) or 'base'}")
        else:
            print(migrations.current(url) or "base (no resilience tables)")
        return 0
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return USAGE_ERROR
    except ResilienceError as exc:  # ConfigurationError, StoreUnavailable
        print(f"python -m resilience: {redact(str(exc))}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
