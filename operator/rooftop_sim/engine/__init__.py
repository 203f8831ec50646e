"""Simulated vLLM engine: timing truth model, continuous-batching core, HTTP server.

``truth``  step-time oracle: measured kernel tables (``kernels``), independent of the planner
``core``   pure, clock-agnostic continuous-batching scheduler (no I/O)
``server`` ``rooftop engine-sim``: OpenAI-compatible HTTP + vLLM-named /metrics
"""
