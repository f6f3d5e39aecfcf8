"""Experiment trackers behind one Protocol: MLflow (default), TensorBoard, none; and the MLflow lineage of Hydra
sweeps (sweep.py: a parent run per sweep, a child per job, a summary table)."""
