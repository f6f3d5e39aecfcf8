"""The composition floor: the only code that reads the whole RunConfig.

It composes and preflights (preflight.py), derives the values that follow from others into a new config
(derive.py), runs the config's own checks and then every component's, each given only the groups it reads
(checks.py), picks the local or the Ray builder (build.py, build_ray.py, sharing inputs.py), turns `_target_` names
into objects (plugins.py) and runs a session (session.py); algorithm.py turns the algorithm group into the trainers'
typed specs, plan.py prints `slime-hydra plan`. Everything below it points down; see docs/architecture.md.
"""
