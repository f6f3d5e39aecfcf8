"""Orchestration: Ray placement, the train group and rollout manager as actors, call deadlines. The only
layer that may import ray."""
