"""Bytes on disk to modules on a device: format detection, NF4 streaming, conversion, T5 worker.

Never imports ComfyUI.
"""
