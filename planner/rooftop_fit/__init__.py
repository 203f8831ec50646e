"""Offline tools around the planner: the fit of its kernel curves and the plots.

``kernel_fit`` fits the kernel curves and the engines' fixed costs to the measured
               tables in ``data/`` and writes ``rooftop_planner/catalog/kernel_curves.json``
               (``make calibrate``, ``python -m rooftop_fit.kernel_fit``)
``plots``      the throughput-latency plane of a plan and its alternatives (matplotlib)

Never imported at run time: the planner, the control law, the operator and the simulator
read only the file the fit wrote. The one exception is ``rooftop plan --plot``, which
loads ``plots`` when asked to draw (an import-linter contract in ``pyproject.toml``
allows that import and no other). ``kernel_fit`` runs from a checkout (``data/`` is not
packaged); ``plots`` draws with the ``plot`` extra.
"""
