"""The closed-loop control law, shared by the operator and the simulator.

``control``      one tick: observations in, a decision (replicas, plan, conditions) out
``readings``     what it observes: readings and their trust, one window's observation
``sizing``       the planner as it sizes with it (the only import of the planner's search)
``forecast``     the request rate's trend and where it is heading
``calibration``  the step-time factor learned from observed TPOT, and the latency trim
``signals``      the engine signals, each declared once
``defaults``     the loop's defaults the operator and the simulator share
``durations``    the one duration grammar

Pure functions over plain values: no Kubernetes, no kopf, no I/O.
"""
