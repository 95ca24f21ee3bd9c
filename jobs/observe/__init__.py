"""Seeing the platform: one snapshot of its state, Prometheus metrics, health, logs, web view.

    snapshot.collect(app)   the whole resilience state as a JSON-able dict (status, web)
    metrics                 a Prometheus collector reading shared state at scrape time
    health                  liveness (the worker answers) apart from readiness (stores up)
    logging                 structured (JSON / logfmt) log lines carrying guard decisions
    web                     /resilience page and /api/resilience inside Flower's own app
    worker                  the worker-side signal handlers (import once in the worker)
"""
