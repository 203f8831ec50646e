"""The ``rooftop`` command: a thin layer over the API, planner, operator and simulator."""
