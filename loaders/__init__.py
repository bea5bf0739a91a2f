"""Bytes on disk to modules: format detection, NF4 streaming and conversion, T5/VAE/camera files, model folders.

Where the loaded weights then live (GPU, pinned RAM, streamed blocks) is `memory/`; the text encoder's child
process is `text_encoder/`. Never imports ComfyUI.
"""
