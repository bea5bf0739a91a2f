"""What the node families share to talk to ComfyUI: no node classes here (those are in nodes/<family>.py).

Model folders and combos (comfy_paths, demo_models), payload types (payloads), the experts and the Fast model as
ComfyUI models (expert_weights, patchers, native_model, dit_slot, lora_attach, lora_patches, fast_host,
fast_state_store), memory (memory, host_memory, cfg_parallel), progress and previews (progress, previews), errors and
the queue-time checks (node_errors, model_check, prompt_guard), widget hints (ui_hints), native CONDITIONING and
video setup (conditioning, video_setup), example inputs (example_inputs) and workflow conversion (workflow_convert).
"""
