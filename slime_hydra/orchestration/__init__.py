"""Orchestration: sweeps across jobs (Hydra launcher callbacks). The only layer that may import ray."""
