"""`jobs metrics`: serve Prometheus metrics on http://127.0.0.1:9808/metrics (the workers'
histograms too when `PROMETHEUS_MULTIPROC_DIR` names their directory)."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer
from prometheus_client import generate_latest, start_http_server

from jobs.admin.status import console, platform_source
from jobs.observe.metrics import multiprocess_dir, registry_for

cli = typer.Typer(help="Prometheus metrics: serve /metrics (shared state + workers).",
                  invoke_without_command=True)


@cli.callback()
def metrics(
    address: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 9808,
    once: Annotated[bool, typer.Option("--once", help="Print one scrape and exit.")] = False,
) -> None:
    """Serve /metrics until Ctrl-C (prometheus-client's own HTTP server)."""
    registry = registry_for(platform_source().app)
    if once:
        typer.echo(generate_latest(registry).decode())
        return
    _, serving = start_http_server(port, addr=address, registry=registry)
    where = multiprocess_dir() or "off (PROMETHEUS_MULTIPROC_DIR unset)"
    console.print(f"metrics on http://{address}:{port}/metrics; multiprocess: {where}")
    with contextlib.suppress(KeyboardInterrupt):
        serving.join()
