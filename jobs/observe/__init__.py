"""Seeing the platform: snapshot, metrics, health, logs, tracing, the web view (docs/observe.md)."""
