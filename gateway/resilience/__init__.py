"""Resilience building blocks: failure taxonomy, circuit breakers, retry budget and backoff.

Each module is usable on its own and free of any web framework; the request pipeline composes
them in one place.
"""
