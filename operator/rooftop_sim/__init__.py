"""Simulation and load tools: the simulated vLLM engine, the simulated cluster, traces.

``engine``    ``rooftop engine-sim``: a vLLM stand-in timed by measured kernel tables
``cluster``   pods running ``engine.core`` engines behind a least-outstanding balancer
``window``    scrape-interval accumulators turned into ``readings.Observation``s
``policies``  rooftop (``control.decide`` itself), static-peak, queue-threshold, oracle
``oracle``    the hindsight baselines: the oracle's schedule and static-fit
``report``    attainment, cost, timeline, JSON and plot
``simulate``  ``rooftop simulate``: replay a trace through the cluster under a policy
``loadgen``   ``rooftop load``: an open-loop OpenAI-API load generator
``traces``    Azure-format trace files

Never imports kopf or the Kubernetes client.
"""
