"""Rooftop's Kubernetes operator (kopf), engine simulator and closed-loop controller."""
