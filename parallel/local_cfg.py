"""CFG over two devices of one process (ComfyUI): the conditional pass on the sampler's device, the unconditional
pass on a second device that holds its own copy of the current expert, in a worker thread. No NCCL: the only
traffic is the inputs going to the second device once per run (the conditioning, the negative text) and per step
(the latent), and the unconditional velocity coming back.

`TwoDeviceCFG(main, second, second_device)` is both the sampler's ExpertProvider and its `velocity`:
- acquire(name): the main provider places the expert on the main device while the second provider places its copy
  on the second device (in parallel, in the worker thread);
- velocity(...): the uncond forward is queued on the worker, the cond forward runs here, then
  `uncond + g * (cond - uncond)` in float32 on the main device: the sampler's formula, so the result equals one
  device's sequential CFG (bit for bit on the CPU);
- release / close: both providers let go; close() frees every weight on the second device and stops the worker.
The second device's memory is the second provider's business (any memory mode of memory/placement.py, planned
for that device's free VRAM); nothing of it outlives the run.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
from typing import Callable, Optional

import torch
import torch.nn as nn


class TwoDeviceCFG:
    def __init__(self, main, second, second_device, log: Optional[Callable[[str], None]] = None):
        self.main, self.second = main, second
        self.device = torch.device(second_device)
        self.log = log or (lambda s: None)
        self.pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-cfg-device")
        self.model_b: Optional[nn.Module] = None
        self._copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(tensor) -> (tensor, its copy on B)
        self._mode: tuple[bool, bool] = (False, False)  # (inference mode, grad enabled) of the sampler's thread
        self.closed = False

    # ---- the worker -------------------------------------------------------------------------------------
    def _in_worker(self, fn, *args):
        inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

        def run():
            device_ctx = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
            mode = torch.inference_mode() if inference else torch.set_grad_enabled(grad)
            with device_ctx, mode:
                out = fn(*args)
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()  # results ready for the main thread
                return out

        return self.pool.submit(run)

    def _on_b(self, t: Optional[torch.Tensor], keep: bool) -> Optional[torch.Tensor]:
        """t on the second device; tensors that stay the same all run (`keep`) are copied once."""
        if t is None:
            return None
        if not keep:
            return t.to(self.device)
        hit = self._copies.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        copy = t.to(self.device)
        self._copies[id(t)] = (t, copy)
        return copy

    # ---- ExpertProvider ------------------------------------------------------------------------------------
    def acquire(self, name: str) -> nn.Module:
        fut = self._in_worker(self.second.acquire, name)
        try:
            model = self.main.acquire(name)
        finally:
            try:
                self.model_b = fut.result()
            except BaseException as e:
                raise RuntimeError(f"the second device {self.device} could not place the {name}-noise expert: "
                                   f"{(str(e).splitlines() or [type(e).__name__])[0]}") from e
        return model

    def release(self, name: str) -> None:
        self.model_b = None
        self.main.release(name)
        self._in_worker(self.second.release, name).result()

    def close(self) -> None:
        """Free the second device's experts and copies and stop the worker (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.model_b = None
        self._copies.clear()
        try:
            self._in_worker(getattr(self.second, "close", lambda: None)).result()
        finally:
            self.pool.shutdown(wait=True)
            close = getattr(self.main, "close", None)
            if close is not None:
                close()

    # ---- the sampler's velocity -------------------------------------------------------------------------
    def velocity(self, model: nn.Module, x: torch.Tensor, t: torch.Tensor, ctx_pos: torch.Tensor,
                 ctx_neg: torch.Tensor, y: torch.Tensor, camera: Optional[torch.Tensor], guide: float, batched: bool,
                 cancel: Callable[[], None]) -> torch.Tensor:
        cancel()
        if guide == 1.0:
            return model(x, t, ctx_pos, y, camera=camera).float()
        model_b = self.model_b
        if model_b is None:
            raise RuntimeError("the second device holds no expert: acquire() first")

        def uncond():
            return model_b(self._on_b(x, False), self._on_b(t, False), self._on_b(ctx_neg, True),
                           self._on_b(y, True), camera=self._on_b(camera, True)).float()

        fut = self._in_worker(uncond)
        try:
            cond = model(x, t, ctx_pos, y, camera=camera).float()
        finally:
            try:
                u = fut.result()  # waited for even when the cond pass failed: nothing keeps running
            except BaseException as e:
                raise RuntimeError(f"the unconditional pass on {self.device} failed: "
                                   f"{(str(e).splitlines() or [type(e).__name__])[0]}") from e
        u = u.to(cond.device)
        return u + guide * (cond - u)
