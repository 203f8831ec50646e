"""The closed-loop control law, shared by the operator and the simulator.

``control``      one tick: observations in, a decision (replicas, plan, conditions) out
``calibration``  the step-time factor learned from observed TPOT, and the latency trim

Pure functions over plain values: no Kubernetes, no kopf, no I/O.
"""
