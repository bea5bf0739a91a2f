"""Host -> GPU copies inside the sampling loops that do not make the host wait for the GPU.

A plain `.to("cuda")` of a host tensor in pageable memory synchronizes the stream: the host waits until every
kernel it has queued has run, and the GPU then idles while the host prepares the next ones. A chunk of the Fast
model used to do that several times (its timesteps, its noise, its RoPE table). Through pinned memory the copy is
queued like a kernel instead; torch's pinned-memory cache keeps the buffer until the copy has run.
"""
from __future__ import annotations

import torch


def upload(t: torch.Tensor, device) -> torch.Tensor:
    """t on `device`: the same values; a host tensor goes to a CUDA device without a host sync."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
