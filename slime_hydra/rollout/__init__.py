"""Rollout backends behind one Protocol: `local` (in-process) and `sglang` (servers behind a router)."""
