"""The job platform's Celery app: `celery -A jobs worker -Q critical`.

`jobs.app` is built on first access, so importing a helper module (`jobs.embedded`,
`jobs.settings`) never reads the environment early.
"""

from __future__ import annotations

import sys
from typing import Any

from resilience.errors import ConfigurationError
from resilience.redact import redact

__all__ = ["app"]

_app: Any = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            try:
                # lazy: the app is built on first access, never when a helper module is imported
                from jobs.platform import create_app

                _app = create_app()
            except ConfigurationError as exc:
                _exit_if_celery_command(exc)
                raise
            except AttributeError as exc:
                # An AttributeError escaping module __getattr__ would read as "cannot
                # import name 'app'" and hide the real cause.
                raise RuntimeError(f"building the Celery app failed: {exc!r}") from exc
        return _app
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


def _exit_if_celery_command(exc: ConfigurationError) -> None:
    """Under `celery -A jobs ...`, print a bad setting as one line and exit 2.

    Celery prints any error of `-A` as a traceback; the `jobs` CLI prints one line. Only
    Celery's own command is ended here: a test or library building the app gets the error.
    """
    import click

    context = click.get_current_context(silent=True)
    celery_command = getattr(sys.modules.get("celery.bin.celery"), "celery", None)
    if context is None or context.find_root().command is not celery_command:
        return
    problems = [str(line).strip() for line in getattr(exc, "problems", None) or []]
    message = ("invalid platform configuration: " + "; ".join(problems)) if problems else str(exc)
    print(f"jobs: {redact(' '.join(message.split()))}", file=sys.stderr)
    raise SystemExit(2)
