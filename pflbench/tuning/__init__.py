"""Sweeps: tuning one algorithm's hyperparameters with Ray Tune and Optuna on the validation split, and stopping a sweep cleanly."""
