"""Benchmark scripts; results are committed under ``benchmarks/results/``."""
