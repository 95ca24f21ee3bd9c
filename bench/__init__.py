"""Benchmarks: `python -m bench <scenario>`; each compares against plain Celery in one run."""
