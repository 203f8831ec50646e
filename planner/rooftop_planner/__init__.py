"""Rooftop's planner: roofline performance model and SLO/budget search (no Kubernetes)."""

__version__ = "0.1.0"
