"""Rooftop's Kubernetes operator: kopf handlers, the loop tick, builders and clients."""
