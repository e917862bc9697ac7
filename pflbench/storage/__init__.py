"""Where results live: the results store (one folder per cell) and round checkpoints."""
