"""The composition floor: the only code that reads the whole RunConfig.

It composes and preflights (preflight.py), runs the config's own checks and then every component's,
each given only the groups it reads (checks.py), picks the local or the Ray builder (build.py,
build_ray.py, sharing inputs.py), runs a session (session.py), and serves `slime-hydra check-hf`
(hf_check.py); algorithm.py turns the algorithm group into the trainers' typed specs. Everything below it points
down; see docs/architecture.md.
"""
