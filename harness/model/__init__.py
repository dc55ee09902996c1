"""What a case is: the case model, its parts and expectations, sweeps, settings, the algorithm and
limits data a case declares."""
