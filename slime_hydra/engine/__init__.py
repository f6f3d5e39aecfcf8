"""The engine: the loop over Components (built by app/), its steps, checkpoints and resume state; Protocols only."""
