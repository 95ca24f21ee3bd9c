"""Tasks that the shared test workers load (JOBS_IMPORTS points here)."""

from __future__ import annotations

import os
from typing import Any

from jobs import app


@app.task(tier="critical", bind=True)
def whoami_critical(self: Any) -> dict[str, Any]:
    return {"hostname": self.request.hostname, "pid": os.getpid()}


@app.task(tier="standard", bind=True)
def whoami_standard(self: Any) -> dict[str, Any]:
    return {"hostname": self.request.hostname, "pid": os.getpid()}


@app.task(tier="optional", bind=True)
def whoami_optional(self: Any) -> dict[str, Any]:
    return {"hostname": self.request.hostname, "pid": os.getpid()}
