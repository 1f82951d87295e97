"""Benchmarks of the project: ``python -m bench`` prints every figure in one table (see README)."""
