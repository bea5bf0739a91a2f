"""Flow-matching schedulers and the sampling loops."""
