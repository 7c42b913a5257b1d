"""Provider simulator, load generator and benchmarks for the gateway."""
