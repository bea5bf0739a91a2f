"""Every call of one world session on ONE worker thread, and one chunk at a time.

The event loop never touches the session: it awaits the worker and reads `snapshot`, a plain dict the worker
refreshes after each operation. A chunk always runs to its end (its frames are pushed to the loop as they are
decoded), whether or not anyone still listens, so closing the tab mid-chunk keeps the session consistent.

A chunk's preview (a session with a tiny decoder: its frames after the first denoising step, world/decoding.py)
is JPEG-encoded on a thread of its own while the chunk's model calls go on, and pushed to the loop the same way,
always before the chunk's first real frames.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Optional

from .frames import image_preview, jpeg, png_data_url

# on_frames(chunk, first_frame_number, [jpeg bytes]) is awaited on the loop for each decoded batch (on_preview: the
# same for a chunk's preview)
FramesCallback = Callable[[int, int, list], Awaitable[None]]


@dataclass(frozen=True)
class ChunkReport:
    chunk: int
    frames: int
    first_frame_s: float  # step request -> first batch of decoded frames ready (server side)
    total_s: float  # step request -> chunk committed
    seconds: dict  # the session's own split (dit, decode, total; preview when there was one)
    preview_s: Optional[float] = None  # step request -> the chunk's preview ready to send (None: no preview)


class SessionDriver:
    def __init__(self, session, prompt: str = "", image: Optional[Path] = None,
                 write_video: Optional[Callable] = None, previews: bool = True):
        """write_video(frames, path, fps) -> path: the door's video writer for Save (frames: an iterator of uint8
        [n, H, W, 3]); None saves the keys and camera path only. previews: send each chunk's preview where the
        session makes one (a tiny decoder; `play --no-preview` turns them off)."""
        self._session = session
        self._write_video = write_video
        self.previews = previews
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-world-session")
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-world-preview")
        self._lock: Optional[asyncio.Lock] = None
        self._closed = False
        self.last_frame: Optional[tuple[int, int, bytes]] = None  # what a new tab shows first
        self._start_jpeg: Optional[bytes] = None
        self.snapshot: dict = {"started": False, "prompt": prompt, "image": str(image) if image else None}

    @property
    def closed(self) -> bool:
        return self._closed

    # ---- the worker side (these run on the session thread only) ----
    def _refresh(self, **extra) -> dict:
        s = self._session
        started = bool(extra.pop("started", self.snapshot.get("started")))
        snap = dict(self.snapshot, started=started, **extra)
        if started:
            snap.update(chunks=s.chunks, frames=s.frames, next_keys=s.keys_for_next_chunk(),
                        action_string=s.action_string(), height=s.height, width=s.width)
        self.snapshot = snap
        return snap

    def start_now(self, image: Path, prompt: str) -> dict:
        """Synchronous start, for a door that starts before serving (the CLI, on its main thread)."""
        self._session.start(image, prompt)
        self._start_jpeg = image_preview(Path(image), self._session.width, self._session.height)
        self.last_frame = (0, 0, self._start_jpeg)
        return self._refresh(started=True, image=str(image), prompt=prompt, minimap="", seconds=None)

    def adopt(self, start_frame) -> dict:
        """A session the door has begun itself (ComfyUI: from its I2V condition); start_frame: uint8 [H, W, 3]."""
        self._start_jpeg = jpeg(start_frame)
        self.last_frame = (0, 0, self._start_jpeg)
        return self._refresh(started=True, minimap="", seconds=None)

    def _restart(self, begin: Callable) -> dict:
        begin(self._session)
        frame = self.start_frame
        self.last_frame = (0, 0, frame) if frame is not None else None
        return self._refresh(started=True, minimap="", seconds=None)

    @property
    def start_frame(self) -> Optional[bytes]:
        return self._start_jpeg

    def _step(self, keys, push, t0: float, previewing: bool) -> ChunkReport:
        first = None
        chunk = self._session.chunks + 1  # numbered from 1 on the wire (0 is the start image)
        frames = 0
        preview: list = []  # the preview's encode, submitted from inside the chunk's run

        def on_preview(batch) -> None:
            preview.append(self._encoder.submit(self._push_preview, chunk, batch, push, t0))

        try:
            for batch in self._session.step(keys, on_preview=on_preview if previewing else None):
                data = [jpeg(f) for f in batch.frames]
                if first is None:
                    first = time.perf_counter() - t0
                    for job in preview:  # the preview goes out before the frames that replace it
                        job.result()
                frames += len(data)
                self.last_frame = (chunk, batch.first_frame + len(data) - 1, data[-1])
                push(chunk, batch.first_frame, data, False)
        finally:
            for job in preview:  # nothing of this chunk is pushed after it ends
                job.exception()
        total = time.perf_counter() - t0
        seconds = self._session.last_times.to_json()
        self._refresh(minimap=png_data_url(self._session.trajectory_picture()), seconds=seconds)
        return ChunkReport(chunk, frames, first or total, total, seconds, preview[0].result() if preview else None)

    @staticmethod
    def _push_preview(chunk: int, batch, push, t0: float) -> float:
        push(chunk, batch.first_frame, [jpeg(f) for f in batch.frames], True)
        return time.perf_counter() - t0

    def _rewind(self, chunks: int) -> dict:
        self._session.rewind(chunks)
        self.last_frame = (0, 0, self._start_jpeg) if chunks == 0 and self._start_jpeg else None
        return self._refresh(minimap=png_data_url(self._session.trajectory_picture()) if chunks else "")

    # ---- the loop side ----
    async def _run(self, fn, *args):
        if self._closed:
            raise RuntimeError("the world session is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # queued calls wait here, so the worker never holds a backlog
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self, image: Path, prompt: str) -> dict:
        return await self._run(self.start_now, image, prompt)

    async def restart(self, begin: Callable) -> dict:
        """The same video again from its start: begin(session) on the worker (a door's fixed start)."""
        return await self._run(self._restart, begin)

    async def step(self, keys, on_frames: FramesCallback, on_preview: Optional[FramesCallback] = None) -> ChunkReport:
        """One chunk with `keys` (an action string, a KeyTimeline or None); frames reach `on_frames` as decoded, and
        the chunk's preview, where the session makes one and previews are on, reaches `on_preview` before them."""
        if not self.snapshot.get("started"):
            raise ValueError("start the session first (pick an image and a prompt)")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        t0 = time.perf_counter()

        def push(chunk, first_frame, data, preview):
            loop.call_soon_threadsafe(queue.put_nowait, (chunk, first_frame, data, preview))

        previewing = self.previews and on_preview is not None
        job = asyncio.ensure_future(self._run(self._step, keys, push, t0, previewing))
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
        while (item := await queue.get()) is not None:
            *args, preview = item
            await (on_preview if preview else on_frames)(*args)
        return await job

    async def rewind(self, chunks: int) -> dict:
        return await self._run(self._rewind, chunks)

    async def save(self, prefix: Path, state: bool = False):
        return await self._run(lambda: self._session.save(prefix, write_video=self._write_video, state=state))

    async def call(self, fn):
        """fn(session) on the worker (for doors: read the action string, the keys, a state...)."""
        return await self._run(fn, self._session)

    def call_now(self, fn):
        """fn(session) on the worker, waited for from a thread that is not the event loop's (ComfyUI's, running a
        node). The worker runs one call at a time, so fn sees the session between chunks, never mid-chunk."""
        if self._closed:
            raise RuntimeError("the world session is closed")
        return self._pool.submit(fn, self._session).result()

    def close(self, wait: bool = True) -> None:
        """Closes the session after a running chunk (idempotent; any thread). wait=False returns at once: the session
        closes on the worker after that chunk (a caller that may hold what the chunk waits for must not wait)."""
        if self._closed:
            return
        self._closed = True
        if wait:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._close_session()
            return
        self._pool.submit(self._close_session)  # queued behind the running chunk (at most one runs or waits)
        self._pool.shutdown(wait=False)

    def _close_session(self) -> None:
        self._encoder.shutdown(wait=True)  # after the last chunk: it may still submit its preview until it ends
        self._session.close()
