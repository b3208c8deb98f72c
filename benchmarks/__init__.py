"""Benchmarks of s2sgrad; run `python -m benchmarks` (see benchmarks/run.py)."""
