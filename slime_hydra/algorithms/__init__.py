"""Pure tensor functions for advantages and losses: no I/O, no torch.distributed, no config trees."""
