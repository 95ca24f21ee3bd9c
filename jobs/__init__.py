"""The job platform's Celery app: `celery -A jobs worker -Q critical`.

`jobs.app` is built on first access, so importing a helper module (`jobs.services`,
`jobs.settings`) never reads the environment early.
"""

from __future__ import annotations

from typing import Any

__all__ = ["app"]

_app: Any = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            from jobs.platform import create_app

            try:
                _app = create_app()
            except AttributeError as exc:
                # An AttributeError escaping module __getattr__ would read as "cannot
                # import name 'app'" and hide the real cause.
                raise RuntimeError(f"building the Celery app failed: {exc!r}") from exc
        return _app
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")
