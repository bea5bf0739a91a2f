"""Several GPUs: CFG-parallel and Ulysses sequence-parallel sampling on torch.distributed (NCCL; gloo on the CPU),
and CFG over two local GPUs inside one process (ComfyUI).

- layout.py: which ranks split what (CFG pair x Ulysses degree) for a world size, a mode and the head count;
- group.py: process groups from torchrun's environment, with timeouts on every collective;
- messages.py: small messages between ranks without pickle (agreement on errors, tensors from rank 0);
- fingerprint.py: a cheap identity of the checkpoint files, compared across ranks before loading;
- ulysses.py: the sequence split around the DiT's self-attention (all-to-all to heads and back);
- cfg.py: the CFG-parallel velocity (each rank one guidance pass, one all-gather per step);
- local_cfg.py: the two guidance passes on two devices of one process (threads, no NCCL).
Nothing here imports ComfyUI; the model and the samplers only call what is attached to them.
"""
