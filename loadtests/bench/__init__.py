"""Benchmark tool for any OpenAI-compatible endpoint: the gateway, a provider, a simulator.

Run ``python -m loadtests.bench --help``. Modules: ``stats`` and ``schedule`` (pure maths),
``client`` (one request), ``engine`` (closed and open loops), ``modes`` / ``comparison`` (the
benchmarks), ``procstat`` (CPU and RSS of processes), ``report`` and ``plots`` (outputs), ``cli``.
"""
