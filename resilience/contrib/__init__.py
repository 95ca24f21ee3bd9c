"""Integrations with frameworks an app is built on (`resilience.contrib.django`)."""
