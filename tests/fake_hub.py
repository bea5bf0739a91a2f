"""A local stand-in for the Hugging Face Hub's file API, for the download tests (never the real hub).

It answers what huggingface_hub asks when `HF_ENDPOINT` points at it (read from huggingface_hub's own source:
hf_api.model_info, file_download.get_hf_file_metadata / http_get):
- GET  /api/models/<owner>/<name>/revision/<rev>   the repository's sha and files (`siblings`, with sizes)
- GET  /api/models/<owner>/<name>/tree/<rev>[/<path>]  the file listing (recursive), for newer clients
- HEAD /<owner>/<name>/resolve/<rev>/<path>         X-Repo-Commit, ETag / X-Linked-Etag, size
- GET  /<owner>/<name>/resolve/<rev>/<path>         the file, or the part a `Range: bytes=N-` header asks for (206)
Served from folders on disk (tiny repositories made from the demo checkpoint), bound to 127.0.0.1 on a free port,
in a thread of the test process. Every request is recorded (method, path, Range); `cut_once` ends one file's first
GET after that many bytes, as a dropped connection does, so a test sees the download resume.

Loaded by path (tests/ is not a package).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from pathlib import Path
from typing import Optional

from aiohttp import web

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, Path]):
        self.repos = {k: Path(v) for k, v in repos.items()}
        self.requests: list[tuple[str, str, Optional[str]]] = []
        self.cut_once: dict[str, int] = {}  # "repo/path" -> bytes sent before the connection drops (once)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self.url = ""

    # ---- repository contents ----------------------------------------------------------------------------
    def files(self, repo: str) -> list[Path]:
        root = self.repos[repo]
        return sorted(p for p in root.rglob("*") if p.is_file())

    def _file(self, repo: str, path: str) -> Optional[Path]:
        root = self.repos.get(repo)
        if root is None:
            return None
        p = (root / path).resolve()
        return p if p.is_file() and root.resolve() in p.parents else None

    @staticmethod
    def etag(p: Path) -> str:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    # ---- handlers -----------------------------------------------------------------------------------------
    async def _model_info(self, request: web.Request):
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        if repo not in self.repos:
            return web.json_response({"error": "Repository not found"}, status=404,
                                     headers={"X-Error-Code": "RepoNotFound"})
        root = self.repos[repo]
        siblings = []
        for p in self.files(repo):
            rel = p.relative_to(root).as_posix()
            size = p.stat().st_size
            siblings.append({"rfilename": rel, "size": size, "blobId": self.etag(p)[:40],
                             "lfs": {"sha256": self.etag(p), "size": size, "pointerSize": 134}})
        return web.json_response({"id": repo, "modelId": repo, "sha": SHA, "private": False, "disabled": False,
                                  "gated": False, "siblings": siblings, "tags": [], "downloads": 0, "likes": 0})

    async def _tree(self, request: web.Request):
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        if repo not in self.repos:
            return web.json_response({"error": "Repository not found"}, status=404)
        root = self.repos[repo]
        under = request.match_info.get("path", "").strip("/")
        out = []
        for p in self.files(repo):
            rel = p.relative_to(root).as_posix()
            if not under or rel.startswith(under + "/"):
                out.append({"type": "file", "path": rel, "size": p.stat().st_size, "oid": self.etag(p)[:40],
                            "lfs": {"oid": self.etag(p), "size": p.stat().st_size, "pointerSize": 134}})
        return web.json_response(out)

    async def _resolve(self, request: web.Request):
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        path = request.match_info["path"]
        p = self._file(repo, path)
        if p is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"}, text="Entry not found")
        size = p.stat().st_size
        etag = self.etag(p)
        headers = {"X-Repo-Commit": SHA, "ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"',
                   "X-Linked-Size": str(size), "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if request.method == "HEAD":
            return web.Response(status=200, headers={**headers, "Content-Length": str(size)})
        start = 0
        rng = request.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng[6:].split("-")[0] or 0)
        data = p.read_bytes()[start:]
        status = 206 if rng else 200
        if rng:
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        resp = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(data))})
        await resp.prepare(request)
        cut = self.cut_once.pop(f"{repo}/{path}", None)
        if cut is not None and cut < len(data):
            await resp.write(data[:cut])
            request.transport.close()  # a dropped connection in the middle of the file
            return resp
        await resp.write(data)
        await resp.write_eof()
        return resp

    @web.middleware
    async def _record(self, request: web.Request, handler):
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        repo = "{owner}/{name}"
        app.router.add_get(f"/api/models/{repo}/revision/{{rev}}", self._model_info)
        app.router.add_get(f"/api/models/{repo}/tree/{{rev}}", self._tree)
        app.router.add_get(f"/api/models/{repo}/tree/{{rev}}/{{path:.+}}", self._tree)
        app.router.add_route("HEAD", f"/{repo}/resolve/{{rev}}/{{path:.+}}", self._resolve)
        app.router.add_get(f"/{repo}/resolve/{{rev}}/{{path:.+}}", self._resolve, allow_head=False)
        return app

    # ---- running ------------------------------------------------------------------------------------------
    def __enter__(self) -> "FakeHub":
        started = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._runner = web.AppRunner(self.app())
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="fake-hub")
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the fake hub did not start")
        return self

    def __exit__(self, *exc) -> None:
        async def stop():
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def gets(self, suffix: str) -> list[Optional[str]]:
        """The Range headers of the GETs of a file whose path ends with `suffix`."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith(suffix) and "/resolve/" in p]


# ---- tiny repositories made from the demo checkpoint -------------------------------------------------------------
def build_tiny_repos(root: Path) -> dict[str, Path]:
    """The releases' layouts with the demo's tiny random weights: the base Cam model (float experts, umT5, its
    tokenizer, the VAE, and files no loader needs), v1 Fast (the repository is its DiT folder) and the v2 1.3B
    (config-less F32 shards at the root). Built once under `root`."""
    import os
    import shutil
    from dataclasses import replace

    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint, demo_configs
    from lingbot_world.loaders.nf4_writer import random_expert_state, write_official_expert
    from lingbot_world.world.demos import demo_config
    from lingbot_world.world.models import V2_1_3B

    root = Path(root)
    demo = root / "demo"
    build_demo_checkpoint(demo)
    cfg = demo_configs()[0]
    cam = root / "lingbot-world-base-cam"
    if not (cam / "README.md").is_file():
        for i, name in enumerate(("high_noise_model", "low_noise_model")):
            state = list(random_expert_state(cfg, seed=30 + i))
            total = sum(t.numel() * 4 for _, t in state)
            write_official_expert(iter(state), cfg, cam / name, max_shard_bytes=total // 2 + 1)
        shutil.copy2(demo / "models_t5_umt5-xxl-enc-bf16.pth", cam / "models_t5_umt5-xxl-enc-bf16.pth")
        shutil.copytree(demo / "google", cam / "google")
        shutil.copy2(demo / "Wan2.1_VAE.pth", cam / "Wan2.1_VAE.pth")
        (cam / "examples" / "00").mkdir(parents=True)
        (cam / "examples" / "00" / "notes.txt").write_text("not a model file: never downloaded\n")
        (cam / "README.md").write_text("tiny random stand-in of robbyant/lingbot-world-base-cam\n")
    fast = root / "lingbot-world-fast"
    if not (fast / "README.md").is_file():
        fcfg = replace(cfg, causal=True)
        state = list(random_expert_state(fcfg, seed=40))
        total = sum(t.numel() * 4 for _, t in state)
        write_official_expert(iter(state), fcfg, fast, max_shard_bytes=total // 2 + 1)
        (fast / "README.md").write_text("tiny random stand-in of robbyant/lingbot-world-fast\n")
    small = root / "lingbot-world-v2-1.3b-causal-fast"
    if not (small / "README.md").is_file():
        scfg = demo_config(V2_1_3B)
        state = list(random_expert_state(scfg, seed=50))
        total = sum(t.numel() * 4 for _, t in state)
        write_official_expert(iter(state), scfg, small, max_shard_bytes=total // 2 + 1, shard_prefix="model",
                              write_config=False)
        (small / "README.md").write_text("tiny random stand-in of robbyant/lingbot-world-v2-1.3b-causal-fast\n")
    os.sync()
    return {"robbyant/lingbot-world-base-cam": cam, "robbyant/lingbot-world-fast": fast,
            "robbyant/lingbot-world-v2-1.3b-causal-fast": small}


if __name__ == "__main__":  # a fake hub to try by hand: python tests/fake_hub.py DIR
    import sys
    import time

    repos = build_tiny_repos(Path(sys.argv[1]))
    with FakeHub(repos) as hub:
        print(json.dumps({"HF_ENDPOINT": hub.url, "repos": sorted(repos)}), flush=True)
        while True:
            time.sleep(3600)
