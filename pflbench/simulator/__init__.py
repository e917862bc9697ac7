"""The engine: batched local training of many clients, the federation a method asks, the round driver, cell groups, and the heterogeneity knobs (system, privacy, shifts)."""
