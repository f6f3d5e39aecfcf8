"""Orchestration: Ray placement, the train group and rollout manager as actors, call deadlines, and the MLflow
lineage of Hydra sweeps. The only layer that may import ray."""
