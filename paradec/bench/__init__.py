"""Benchmark harness: prompt files, random-init stand-in models, tables."""
