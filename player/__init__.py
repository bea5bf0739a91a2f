"""The live player: one resident world session driven from a browser page (keys in, JPEG frames out).

A door, beside cli/ and nodes/: `lingbot-world play` (cli/play.py) serves it on its own aiohttp server;
the ComfyUI Play node (nodes/play.py) mounts the same routes and page on ComfyUI's server.

- `driver.SessionDriver`: every call of the session on one worker thread, one chunk at a time.
- `routes.Player`: the page, its static files, uploads and the WebSocket, all behind a per-run token.
- `guard.RequestGuard`: the token, and on the standalone server the Host and Origin of every request.
- `uploads`, `messages`: start images checked from their header, socket messages checked for size, rate and shape.
- `render_job.RenderJob`: "render this path" as a background `lingbot-world generate` child.
- `loading.LoadingServer`: the "loading…" page on the bound socket while the model loads.
- `standalone.serve`: the standalone server of `lingbot-world play` (bound socket, browser, clean exit).
"""
