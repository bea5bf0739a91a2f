// LingBot-World player page: plays chunks at 16 fps as they arrive, samples the keys once per video frame (keys.js),
// asks for the next chunk as soon as the server is free (the keys sampled since the last request are its key
// timeline), and drives the server's one world session over a WebSocket (protocol: player/routes.py; frames:
// player/frames.py). A chunk's preview, where the server sends one, is shown marked until its real frames come
// (screen.js).
"use strict";
(() => {
  const { FRAME_MS, KEYS, foldTo, actionString, takeKeys, asksNow, frameClock } = window.lingbotKeys;
  const { header, placeReal, screenReport, HEADER_BYTES } = window.lingbotScreen;
  const TOKEN = document.body.dataset.token;
  const $ = (id) => document.getElementById(id);
  const screen = $("screen");
  const ctx = screen.getContext("2d");

  // ---- state (window.lingbotPlayer exposes it for tests and curious users) ----
  const P = {
    state: null, running: false, paused: true, inFlight: false, discard: false,
    need: 0, pending: [], sent: [], shown: 0, shownChunk: 0, chunkEnds: [],
    requests: {}, // chunk -> its clock until its real frames are on screen (screen.js screenReport)
    onScreen: null, // {chunk, frame, preview} of the frame drawn last
    previewFrames: 0, // preview frames received
    lead: Infinity, // seconds from a request to its first frame, as last measured (the server's latency)
    notes: [], errors: [], saved: null, render: null, busy: false, connected: false,
    timings: {}, timingSummary: null, // chunk -> its latest row (both clocks: player/timings.py)
    sampledFrames: 0, // key samples taken: one per video frame played, however often the page runs
    tickEvery: FRAME_MS, // the page's own tick; a slow page ticks less often and takes several samples a tick
    noteMs: 8000, errorMs: 15000, // how long a note or an error stays on screen
  };
  window.lingbotPlayer = P;
  const held = new Set();
  const latched = new Set();
  const queue = []; // {chunk, frame, bmp} in arrival order
  const boundary = {}; // chunk number -> its last frame (rewind shows it)
  let decodeChain = Promise.resolve();
  let epoch = 0; // bumped on rewind/start: frames decoded for an older epoch are dropped
  let keyChangeAt = 0, lastSample = null, lastKeyEventAt = 0, lastSampleAt = 0, noteTimer = 0;
  const frames = frameClock();
  const MAX_PENDING = 64; // samples kept while a request waits (older ones are folded together: a tap still counts)
  const shownTimes = [];
  let ws = null;

  // ---- helpers ----
  function url(path) {
    const u = new URL(path, location.href);
    u.searchParams.set("token", TOKEN);
    return u;
  }
  function note(text, isError) {
    const el = $("note");
    el.textContent = text;
    el.className = isError ? "error" : "";
    (isError ? P.errors : P.notes).push(text);
    clearTimeout(noteTimer); // a note stays until the next one, or a while
    noteTimer = setTimeout(() => { el.textContent = ""; el.className = ""; }, isError ? P.errorMs : P.noteMs);
  }
  function send(obj) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(obj));
  }
  function sampleKeys() {
    const on = new Set([...held, ...latched]);
    latched.clear();
    return [...KEYS].filter((k) => on.has(k)).join("");
  }
  function heldKeys() {
    return [...KEYS].filter((k) => held.has(k)).join("");
  }
  function fmt(s) { return s == null ? "-" : `${Number(s).toFixed(2)} s`; }
  function resetStats() { // a new video: no number of the last one stays on screen
    for (const id of ["s-chunk-time", "s-first", "s-key", "s-key-median", "s-key-preview", "s-fps"]) {
      $(id).textContent = "-";
    }
    P.timings = {}; P.timingSummary = null; P.lastServerFirst = null; P.chunkEnds = []; P.sent = [];
    shownTimes.length = 0;
  }

  // ---- display ----
  function draw(bmp, item) {
    if (!bmp) return;
    if (screen.width !== bmp.width || screen.height !== bmp.height) {
      screen.width = bmp.width; screen.height = bmp.height;
    }
    ctx.drawImage(bmp, 0, 0);
    P.onScreen = item ? { chunk: item.chunk, frame: item.frame, preview: item.preview } : null;
    $("preview-badge").hidden = !(item && item.preview);
  }
  function showKeys() {
    const on = new Set([...held, ...latched]);
    document.querySelectorAll("#keys kbd").forEach((el) => el.classList.toggle("on", on.has(el.dataset.k)));
  }
  function showState() {
    const s = P.state || {};
    $("s-chunk").textContent = s.started ? String(s.chunks) : "-";
    $("s-frames").textContent = s.started ? String(s.frames) : "-";
    $("actions").textContent = s.action_string || "";
    $("rewind-to").max = String(s.chunks || 0);
    if (s.minimap) { $("minimap").src = s.minimap; $("minimap").hidden = false; } else { $("minimap").hidden = true; }
    const ready = Boolean(s.started);
    for (const id of ["pause", "rewind", "save"]) $(id).disabled = !ready;
    const canRender = ready && s.chunks > 0;
    $("render-cmd").disabled = !canRender;
    $("render-run").disabled = !canRender || !(P.renderAvailable);
    if (s.prompt && !$("prompt").value) $("prompt").value = s.prompt;
  }

  // The clock: one tick per video frame. It shows the next buffered frame, samples the keys, and asks for the next
  // chunk when the server is free (requests are pipelined: the server never waits for a chunk's playback).
  let nextTick = performance.now();
  function tick() {
    const now = performance.now();
    if (P.running && !P.paused) {
      // the video's frames begun since the last tick (one at 16 ticks a second, more on a slower page): each plays
      // one buffered frame (the last of them is drawn) and takes one sample of the keys
      const due = frames.due(now);
      let last = null;
      for (let n = 0; n < due && queue.length; n += 1) {
        last = queue.shift();
        P.shown += 1;
        shownTimes.push(now);
        onScreen(last, now);
      }
      if (last) draw(last.bmp, last);
      if (!P.discard) {
        for (let n = 0; n < due; n += 1) sample(now);
        trySend();
      }
    }
    while (shownTimes.length && shownTimes[0] < now - 2000) shownTimes.shift();
    $("s-fps").textContent = P.running && !P.paused ? (shownTimes.length / 2).toFixed(1) : "-";
    showKeys();
    nextTick = Math.max(nextTick + P.tickEvery, now + 1);
    setTimeout(tick, nextTick - performance.now());
  }

  function sample(now) {
    const k = sampleKeys();
    // a change of the held keys, timed from the key event itself (up to 1/16 s before this sample), or from the
    // previous sample or Play when the key went down before them (a key tapped while paused)
    if (lastSample !== null && k !== lastSample && !keyChangeAt) keyChangeAt = Math.max(lastKeyEventAt, lastSampleAt);
    lastSample = k;
    lastSampleAt = now;
    P.pending.push(k);
    P.sampledFrames += 1;
    foldTo(P.pending, MAX_PENDING);
  }

  P.policy = { takeKeys, asksNow, frameClock, placeReal, screenReport }; // for the page's tests

  function trySend() {
    if (!P.running || P.paused || P.inFlight || P.discard) return;
    if (!asksNow(queue.length, P.lead)) return;
    const now = performance.now();
    // the frames begun since the last tick, at least one: the keys held at this moment (and a tap) count too
    for (let n = frames.due(now, true); n > 0; n -= 1) sample(now);
    const keys = actionString(takeKeys(P.pending.splice(0), P.need, heldKeys()));
    P.sent.push(keys);
    P.inFlight = true;
    const chunk = (P.state ? P.state.chunks : 0) + 1;
    P.requests[chunk] = { sentAt: now, arrivedAt: 0, keyChange: keyChangeAt };
    keyChangeAt = 0;
    send({ op: "step", keys });
  }

  function onScreen(item, now) { // a frame reached the screen: the page's clock (screen.js) reports it
    if (!item.preview) P.shownChunk = item.chunk;
    const report = screenReport(P.requests, item, now, shownTimes.length > 1 ? shownTimes.length / 2 : null);
    if (!report) return;
    if (!item.preview) {
      $("s-first").textContent = `${fmt(report.request_to_arrival_s)} (server ${fmt(P.lastServerFirst)})`;
      if (report.key_to_screen_s !== null) $("s-key").textContent = fmt(report.key_to_screen_s);
    }
    send(report); // the server keeps the page's clock beside its own (player/timings.py)
  }

  function playFrom(state, frame) {
    // (re)start playing at a chunk boundary: the screen shows `frame`, the keys sampled from now on go into the
    // next request
    P.state = state;
    queue.length = 0;
    P.pending = [];
    P.requests = {};
    P.need = state.next_keys || 0;
    P.running = true;
    P.discard = false;
    $("pause").textContent = P.paused ? "Play" : "Pause";
    P.inFlight = false;
    lastSample = null; keyChangeAt = 0;
    frames.start(performance.now());
    if (frame) draw(frame, { chunk: state.chunks, frame: state.frames - 1, preview: false });
    showState();
  }

  // ---- socket ----
  function onFrame(buf) {
    const { chunk, frame, preview } = header(buf);
    const blob = new Blob([buf.slice(HEADER_BYTES)], { type: "image/jpeg" });
    const myEpoch = epoch;
    const r = P.requests[chunk];
    if (preview) {
      P.previewFrames += 1;
      if (r && r.previewAt === undefined) r.previewAt = performance.now();
    } else if (r && !r.arrivedAt) { // the lead (when to ask) follows the real frames: previews only fill gaps
      r.arrivedAt = performance.now();
      P.lead = (r.arrivedAt - r.sentAt) / 1000;
    }
    decodeChain = decodeChain.then(() => createImageBitmap(blob)).then((bmp) => {
      if (!preview) boundary[chunk] = bmp;
      if (myEpoch !== epoch || P.discard) return;
      const item = { chunk, frame, bmp, preview };
      if (chunk === 0 || P.pendingStill) { // the start image, or the last frame shown to a tab that reconnects
        P.pendingStill = false;
        draw(bmp, item);
      } else if (preview) {
        queue.push(item);
      } else if (placeReal(queue, P.onScreen, item) === "redraw") {
        draw(bmp, item);
        onScreen(item, performance.now());
      }
    }).catch((e) => note(`a frame could not be decoded: ${e}`, true));
  }

  function onMessage(m) {
    switch (m.type) {
      case "hello":
        P.renderAvailable = m.render && m.render.available;
        if (m.render && m.render.fixed_start) { // the start comes from the door (ComfyUI's graph): restart only
          for (const id of ["image-pick", "image-upload", "prompt"]) $(id).closest("label").hidden = true;
          $("start").textContent = "Restart";
          $("render-run").hidden = true;
          $("render-target").hidden = true;
        }
        P.state = m.state;
        if (m.state.started) { P.pendingStill = true; playFrom(m.state, null); }
        showState();
        loadImages();
        break;
      case "state": // a new video (start / restart): the old chunk boundaries and numbers are gone
        epoch += 1;
        resetStats();
        for (const c of Object.keys(boundary)) if (Number(c) > 0) delete boundary[c];
        decodeChain = decodeChain.then(() => { playFrom(m.state, null); });
        break;
      case "chunk_begin":
        break;
      case "chunk_end":
        P.chunkEnds.push(m);
        P.lastServerFirst = m.first_frame_s;
        $("s-chunk-time").textContent = fmt(m.total_s);
        decodeChain = decodeChain.then(() => {
          // in order with the chunk's frames: once no request is in flight, P.state holds every chunk asked for
          P.inFlight = false;
          if (P.discard) return;
          P.state = m.state;
          P.need = m.state.next_keys;
          showState();
          trySend();
        });
        break;
      case "rewound":
        epoch += 1;
        decodeChain = decodeChain.then(() => {
          const n = m.state.chunks;
          for (const c of Object.keys(boundary)) if (Number(c) > n) delete boundary[c];
          playFrom(m.state, boundary[n]);
          note(`rewound to chunk ${n}`);
        });
        break;
      case "saved":
        P.saved = m.files;
        $("saved").textContent = "saved: " + m.files.join(", ");
        break;
      case "render": {
        P.render = m;
        $("render").hidden = false;
        const p = $("render-progress");
        p.hidden = m.status === "command"; // a command shown is not a job: no bar
        if (m.progress == null) p.removeAttribute("value"); else p.value = m.progress;
        $("render-text").textContent = `${m.status}${m.out ? " -> " + m.out : ""} ${m.line || ""}`;
        $("render-command").textContent = m.command || "";
        $("render-cancel").hidden = m.status !== "running";
        break;
      }
      case "timings": {
        P.timings[m.row.chunk] = m.row;
        P.timingSummary = m.summary;
        const k = m.summary.key_to_screen_s;
        if (k) $("s-key-median").textContent = `${fmt(k.median)} (p90 ${fmt(k.p90)}, ${k.n} changes)`;
        const kp = m.summary.key_to_preview_s;
        if (kp) $("s-key-preview").textContent = `${fmt(kp.median)} median (p90 ${fmt(kp.p90)})`;
        break;
      }
      case "note":
        note(m.message, false);
        break;
      case "error":
        note(m.message, true);
        if (m.op === "step") { P.inFlight = false; }
        break;
      case "busy":
        P.busy = true;
        $("app").hidden = true;
        $("busy").hidden = false;
        $("busy-text").textContent = m.message;
        break;
    }
  }

  function connect() {
    const u = url("ws");
    u.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    ws = new WebSocket(u);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => { P.connected = true; };
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") onMessage(JSON.parse(ev.data)); else onFrame(ev.data);
    };
    ws.onclose = () => {
      P.connected = false;
      if (!P.busy) note("disconnected from the server (it stopped, or the network dropped); reload to reconnect", true);
    };
  }

  // ---- keys ----
  function typing(ev) {
    const t = ev.target;
    return t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT");
  }
  document.addEventListener("keydown", (ev) => {
    if (typing(ev) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const k = ev.key.toLowerCase();
    if (k.length === 1 && KEYS.includes(k)) {
      if (!ev.repeat) lastKeyEventAt = performance.now();
      held.add(k); latched.add(k); ev.preventDefault(); showKeys();
    } else if (k === " ") {
      ev.preventDefault(); togglePause();
    } else if (ev.key.length === 1) {
      note(`'${ev.key}' is not a control key and was ignored: W A S D move, I J K L look, Space pauses`);
    }
  });
  document.addEventListener("keyup", (ev) => {
    const k = ev.key.toLowerCase();
    if (held.delete(k)) { lastKeyEventAt = performance.now(); showKeys(); }
  });
  window.addEventListener("blur", () => { held.clear(); showKeys(); }); // no stuck keys after alt-tab

  // ---- buttons ----
  function togglePause() {
    if (!P.running) return;
    P.paused = !P.paused;
    if (!P.paused) { lastSampleAt = performance.now(); frames.start(lastSampleAt); }
    $("pause").textContent = P.paused ? "Play" : "Pause";
    if (!P.paused) trySend();
  }
  $("pause").onclick = togglePause;
  $("rewind").onclick = () => {
    const n = Number($("rewind-to").value);
    P.discard = true;
    queue.length = 0;
    send({ op: "rewind", chunks: n });
  };
  $("save").onclick = () => send({ op: "save", state: $("save-state").checked });
  $("render-run").onclick = () => send({ op: "render", target: $("render-target").value, run: true });
  $("render-cmd").onclick = () => send({ op: "render", target: $("render-target").value, run: false });
  $("render-cancel").onclick = () => send({ op: "cancel_render" });
  $("start").onclick = () => {
    P.running = false;
    send({ op: "start", image: $("image-pick").value || null, prompt: $("prompt").value });
  };
  $("image-upload").onchange = async () => {
    const file = $("image-upload").files[0];
    if (!file) return;
    const body = new FormData();
    body.append("image", file);
    let r;
    try {
      r = await fetch(url("upload"), { method: "POST", body });
    } catch (e) {
      note(`upload failed: ${e}`, true);
      return;
    }
    if (!r.ok) { note(`upload refused (${r.status}): ${(await r.text()).trim()}`, true); return; }
    const { image } = await r.json();
    await loadImages(image);
    note(`uploaded as ${image}; press Start`);
  };
  async function loadImages(select) {
    const r = await fetch(url("images"));
    if (!r.ok) return;
    const { default: first, uploads } = await r.json();
    const pick = $("image-pick");
    pick.innerHTML = "";
    for (const name of [first, ...uploads].filter(Boolean)) {
      const o = document.createElement("option");
      o.value = name === first ? "" : name;
      o.textContent = name;
      pick.appendChild(o);
    }
    if (select) pick.value = select;
  }

  screen.addEventListener("click", () => screen.focus());
  // after a click on a control the keys go back to the video (Space on a focused button would press it again)
  document.querySelectorAll("#controls button, #controls select").forEach((el) =>
    el.addEventListener(el.tagName === "SELECT" ? "change" : "click", () => { el.blur(); screen.focus(); }));
  connect();
  setTimeout(tick, 0);
})();
