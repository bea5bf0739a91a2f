"""A real ComfyUI server for the opt-in tests: temp base directory with this pack linked in, start, stop.

Loaded by path (tests/ is not a package): `load_sibling` in conftest.py. Needs COMFYUI_PATH (a ComfyUI
checkout, never modified) and optionally COMFYUI_PYTHON (its interpreter, default this one).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
PACK_DIR_NAME = "ComfyUI-LingBot-World"
COMFYUI = os.environ.get("COMFYUI_PATH")
PYTHON = os.environ.get("COMFYUI_PYTHON", sys.executable)
# LINGBOT_COMFY_GPU=1: ComfyUI picks its own device (CUDA) instead of running with --cpu; memory checks then read
# the card's used VRAM instead of the server's RSS.
GPU = os.environ.get("LINGBOT_COMFY_GPU") == "1"


def skip_reason() -> Optional[str]:
    """Why the real-server tests cannot run here, or None."""
    if not COMFYUI or not (Path(COMFYUI) / "main.py").is_file():
        return ("set COMFYUI_PATH to a ComfyUI checkout (and COMFYUI_PYTHON to its venv's python) to run the "
                "real-server tests")
    return None


# ---- small clients ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebSocket:
    """Just enough RFC 6455 to read ComfyUI's event stream (server frames are never masked)."""

    def __init__(self, port: int, client_id: str):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(4096)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert b" 101 " in head.split(b"\r\n")[0], head

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        head = bytes([0x80 | opcode, 0x80 | len(payload)]) + mask  # control frames only: < 126 bytes
        self.sock.sendall(head + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def recv(self, timeout: float):
        """(opcode, payload): 1 = text, 2 = binary; None on timeout."""
        self.sock.settimeout(timeout)
        try:
            while True:
                b0, b1 = self._read(2)
                opcode, n = b0 & 0x0F, b1 & 0x7F
                if n == 126:
                    (n,) = struct.unpack(">H", self._read(2))
                elif n == 127:
                    (n,) = struct.unpack(">Q", self._read(8))
                payload = self._read(n)
                if opcode == 9:
                    self._send(10, payload)
                    continue
                if opcode == 8:
                    raise ConnectionError("websocket closed by the server")
                return opcode, payload
        except socket.timeout:
            return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, base: Path, log_path: Path):
        self.proc, self.port, self.base, self.log_path = proc, port, base, log_path
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return json.load(r)

    def post(self, path: str, body: dict):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
        return json.loads(data) if data else None

    def wait_idle(self, timeout: float = 60) -> None:
        """Until no prompt runs or waits in ComfyUI's queue."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            q = self.get("/queue")
            if not q["queue_running"] and not q["queue_pending"]:
                return
            time.sleep(0.5)
        raise AssertionError("the queue did not become idle")

    def free(self, until: Optional[Callable[[], bool]] = None, timeout: float = 120, **flags) -> bool:
        """ComfyUI's "Free model and node cache": POST /free (both flags, unless `flags` names them) once the prompt
        worker waits for work again. 0.3.64's worker reads the flags after each prompt, then waits; a /free that
        lands in between (the prompt's end already reported, its flags already read) wakes nobody and is read only
        after the next prompt. So it is sent when the queue is idle and 2 s later; with `until` (what the free does,
        seen from outside) it is sent again every 10 s until that holds or `timeout` passes. Returns until()."""
        body = flags or {"unload_models": True, "free_memory": True}
        self.wait_idle()
        time.sleep(2)
        self.post("/free", body)
        if until is None:
            time.sleep(3)
            return True
        t0 = sent = time.monotonic()
        while not until():
            if time.monotonic() - t0 > timeout:
                return False
            if time.monotonic() - sent >= 10:
                self.post("/free", body)
                sent = time.monotonic()
            time.sleep(0.5)
        return True

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def vram_used(self) -> int:
        """Bytes in use on ComfyUI's device, as /system_stats reports it (the whole card)."""
        dev = self.get("/system_stats")["devices"][0]
        return int(dev["vram_total"]) - int(dev["vram_free"])

    def memory_in_use(self) -> int:
        """Where the weights live: VRAM with LINGBOT_COMFY_GPU=1, else the server's RSS."""
        return self.vram_used() if GPU else self.rss()

    def _history(self, pid: str, timeout: float = 30) -> dict:
        """The prompt's history entry. ComfyUI sends execution_error before it writes the history (the worker
        stores it once execute() returns), so right after an error the entry may not exist yet: poll for it."""
        t0 = time.monotonic()
        while True:
            entry = self.get(f"/history/{pid}").get(pid)
            if entry is not None or time.monotonic() - t0 > timeout:
                return entry or {}
            time.sleep(0.2)

    def run(self, prompt: dict, timeout: float = 300, on_progress=None) -> dict:
        """Queue an API prompt and follow it on the websocket until it ends; returns what happened."""
        client_id = uuid.uuid4().hex
        ws = WebSocket(self.port, client_id)
        try:
            try:
                queued = self.post("/prompt", {"prompt": prompt, "client_id": client_id})
            except urllib.error.HTTPError as e:
                raise AssertionError(f"/prompt refused the workflow: {e.read().decode()[:3000]}") from None
            # ComfyUI queues a prompt when at least one output validates and silently drops the others ("Output
            # will be ignored"): the run then ends "done" without the dropped nodes ever running.
            if queued.get("node_errors"):
                raise AssertionError(f"/prompt dropped outputs that failed validation: "
                                     f"{json.dumps(queued['node_errors'])[:3000]}")
            pid = queued["prompt_id"]
            result = {"prompt_id": pid, "progress": [], "previews": 0, "preview_images": [], "texts": [], "end": None,
                      "error": None}
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout:
                msg = ws.recv(timeout=5)
                if msg is None:
                    continue
                opcode, payload = msg
                if opcode == 2:
                    kind = struct.unpack(">I", payload[:4])[0]
                    if kind == 1:  # PREVIEW_IMAGE: image type, then the encoded image
                        result["previews"] += 1
                        result["preview_images"].append(payload[8:])
                    elif kind == 4:  # PREVIEW_IMAGE_WITH_METADATA: JSON length, JSON, image
                        (n,) = struct.unpack(">I", payload[4:8])
                        result["previews"] += 1
                        result["preview_images"].append(payload[8 + n:])
                    elif kind == 3:  # TEXT (progress text shown on a node): node id length, node id, text
                        (n,) = struct.unpack(">I", payload[4:8])
                        result["texts"].append((payload[8:8 + n].decode(), payload[8 + n:].decode()))
                    continue
                event = json.loads(payload)
                kind, data = event.get("type"), event.get("data", {})
                if data.get("prompt_id") not in (None, pid):
                    continue
                if kind == "progress":
                    result["progress"].append((data["node"], data["value"], data["max"]))
                    if on_progress is not None:
                        on_progress(data)
                elif kind == "execution_error":
                    result["end"], result["error"] = "error", data
                    break
                elif kind == "execution_interrupted":
                    result["end"] = "interrupted"
                    break
                elif kind == "executing" and data.get("node") is None and data.get("prompt_id") == pid:
                    result["end"] = "done"
                    break
            result["seconds"] = time.monotonic() - t0
            result["history"] = self._history(pid) if result["end"] is not None else {}
            return result
        finally:
            ws.close()


def prepare_base(base: Path, demo: bool = True) -> None:
    """Folders ComfyUI expects, this repository as custom_nodes/PACK_DIR_NAME, and (demo) the tiny demo checkpoints
    (Cam and Act). The demo image and the release's examples come with the example inputs the pack copies into
    input/lingbot_examples/ at start-up."""
    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint

    for d in ("custom_nodes", "models/lingbot_world", "input", "output", "user", "temp"):
        (base / d).mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / PACK_DIR_NAME).symlink_to(REPO, target_is_directory=True)
    if demo:
        build_demo_checkpoint(base / "models" / "lingbot_world" / "lingbot-demo")
        build_demo_checkpoint(base / "models" / "lingbot_world" / "lingbot-demo-act", control="act")  # tiny Act experts


def write_tiny_loras(loras: Path, cfg) -> None:
    """The same random LoRA twice (ComfyUI keys with alpha, diffusers keys through diffusers' converter) and one
    made for a wider model."""
    import torch
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_wan_lora_to_diffusers

    from lingbot_world.loaders.lora_files import dit_weight_shapes
    from lingbot_world.quant.nf4 import nf4_linear_names
    from safetensors.torch import save_file

    loras.mkdir(parents=True, exist_ok=True)
    shapes = dit_weight_shapes(cfg)
    g = torch.Generator().manual_seed(5)
    comfy_sd, plain = {}, {}
    rank = 4
    for name in nf4_linear_names(cfg.num_layers):
        if "cam" in name or "c2ws" in name:
            continue  # diffusers has no camera layers
        out_f, in_f = shapes[f"{name}.weight"]
        down = torch.randn(rank, in_f, generator=g) / in_f**0.5
        up = 0.5 * torch.randn(out_f, rank, generator=g)
        comfy_sd[f"diffusion_model.{name}.lora_down.weight"] = down
        comfy_sd[f"diffusion_model.{name}.lora_up.weight"] = up
        comfy_sd[f"diffusion_model.{name}.alpha"] = torch.tensor(float(rank))  # scale 1
        plain[f"diffusion_model.{name}.lora_A.weight"] = down
        plain[f"diffusion_model.{name}.lora_B.weight"] = up
    save_file(comfy_sd, str(loras / "lingbot_tiny_comfy.safetensors"))
    save_file(_convert_non_diffusers_wan_lora_to_diffusers(plain), str(loras / "lingbot_tiny_diffusers.safetensors"))
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(4, 1536),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(1536, 4)},
              str(loras / "wan_1_3b_style.safetensors"))


def write_random_wan21_vae(path: Path) -> None:
    """A full-size Wan 2.1 VAE with random weights (bf16, 254 MB) under the release's key names: ComfyUI's own
    VAELoader reads it as a Wan 2.1 VAE, so the native graph runs without the real file."""
    import torch
    from safetensors.torch import save_file

    from lingbot_world.wan.vae.model import VAEConfig, WanVAE

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in WanVAE(VAEConfig()).state_dict().items()}
    save_file(sd, str(path))


@contextmanager
def running_server(base: Path, start_timeout: float = 180, env: Optional[dict] = None) -> Iterator[Server]:
    """Start ComfyUI (CPU unless LINGBOT_COMFY_GPU=1, 127.0.0.1, free port) on a prepared base directory; stop it on exit.

    ComfyUI's default preview method (none) on purpose: LingBot samplers preview anyway. LINGBOT_COMFY_ARGS adds
    arguments, e.g. "--front-end-root /path/to/comfyui_frontend_package/static" to try another frontend.

    env: extra environment variables for the server process."""
    port = free_port()
    log_path = base / "server.log"
    cmd = [PYTHON, "main.py"] + ([] if GPU else ["--cpu"]) + ["--listen", "127.0.0.1", "--port", str(port), "--base-directory", str(base),
           "--disable-auto-launch"] + os.environ.get("LINGBOT_COMFY_ARGS", "").split()  # e.g. "--verbose DEBUG"
    # glibc's default heap behaviour on purpose (no MALLOC_MMAP_THRESHOLD_): freed weight chunks stay in its heap
    # unless the pack trims it, so the RSS checks see what users see.
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))  # PYTHONUNBUFFERED: log lines in order, at once
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=COMFYUI, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)
    srv = Server(proc, port, base, log_path)
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited with {proc.returncode} during start-up:\n{srv.log()[-4000:]}")
            try:
                srv.get("/system_stats")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() - t0 > start_timeout:
                    pytest.fail(f"ComfyUI did not answer within {start_timeout:.0f} s:\n{srv.log()[-4000:]}")
                time.sleep(1)
        srv.startup_s = time.monotonic() - t0
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
