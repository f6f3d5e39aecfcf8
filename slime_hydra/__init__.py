"""slime_hydra: declarative, Hydra-composed RL post-training for LLMs.

Importing the package is cheap on purpose: it pulls in neither torch nor ray.
Heavy modules (training, rollout, orchestration) are imported where they are used.
"""

__version__ = "0.1.0"
