"""torch.export and Circle conversion as the harness runs them, and the caches that may stand in for
them."""
