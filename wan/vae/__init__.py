"""The Wan2.1 causal video VAE."""
