"""ComfyUI node classes: the only layer that imports comfy / folder_paths."""
NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
