"""``rooftop simulate``'s parts: a discrete-event cluster, Prometheus-like metrics
windows, scaling policies and the report. The CLI lives in ``rooftop_operator.simulate``.

``cluster``  pods running ``engine_sim.core`` engines behind a least-outstanding balancer
``window``   scrape-interval accumulators turned into ``control.Observation``s
``policies`` rooftop (``control.decide`` itself), static-peak, queue-threshold, oracle
``oracle``   the hindsight baselines: the oracle's schedule and static-fit
``report``   attainment, cost, timeline, JSON and plot
"""
