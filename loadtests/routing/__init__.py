"""Routing benchmarks: simulated fleets, gateway policies and the harness that drives them."""
