"""Perf-model service: refits Ascendra's regression (§3.3) from executed batches."""
