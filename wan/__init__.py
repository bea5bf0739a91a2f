"""Pure PyTorch model code for LingBot-World: DiT, umT5, VAE, schedulers, camera maths.

Nothing here imports ComfyUI or knows about file formats (that is `loaders/`).
"""
