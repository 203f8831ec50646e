"""Offline tools around the planner: the fit of its kernel curves.

``kernel_fit`` fits the kernel curves and the engines' fixed costs to the measured
               tables in ``data/`` and writes ``rooftop_planner/catalog/kernel_curves.json``
               (``make calibrate``, ``python -m rooftop_fit.kernel_fit``)

Never imported at run time (an import-linter contract in ``pyproject.toml``): the
planner, the control law, the operator, the simulator and the CLI read only the file the
fit wrote. It runs from a checkout (``data/`` is not packaged).
"""
