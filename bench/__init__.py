"""Benchmarks: `python -m bench` runs all, `python -m bench.<name>` one. Each prints its figures."""
