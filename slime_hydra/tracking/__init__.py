"""Experiment trackers behind one Protocol: MLflow (default), TensorBoard, none."""
