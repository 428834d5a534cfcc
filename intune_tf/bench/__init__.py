"""Benchmarking: `intune bench` (the harness), scenarios, CPU resizing, the
demo and shared workloads.
"""
