"""Quantized linears (bitsandbytes NF4) and their compute paths."""
