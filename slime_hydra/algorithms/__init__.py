"""Pure tensor functions for advantages and losses: no I/O, no torch.distributed, no config trees.

Two modules read the algorithm group, and only to name those functions: `estimators.py`, the table of advantage
estimators by name, and `checks.py`, the checks that depend on an estimator's row."""
