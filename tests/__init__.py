"""Rooftop test suite (a package so tests.cluster is importable)."""
