"""The LingBot-World DiT: model, blocks, 3D RoPE and the attention backend."""
