"""Breaker storage backends: the atomic steps (acquire, record, force) of the algorithm."""
