"""Pure PyTorch model code for LingBot-World, one subpackage per concern:

dit/ (the transformer, RoPE, attention), vae/, text/ (umT5), sampling/ (schedulers, sampling loops),
control/ (camera geometry, presets, paths); sizes.py and i2v.py are shared by all of them.
Nothing here imports ComfyUI or knows about file formats (that is `loaders/`).
"""
