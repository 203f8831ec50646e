"""Simulated vLLM engine: timing truth model, continuous-batching core, HTTP server.

``truth``  fitted step-time oracle (independent of the planner's roofline formula)
``core``   pure, clock-agnostic continuous-batching scheduler (no I/O)
``server`` ``rooftop engine-sim``: OpenAI-compatible HTTP + vLLM-named /metrics
"""
