// LingBot-World player: the page's key bookkeeping, free of the page's clock and socket (player.js uses it; the
// browser test calls it directly). Keys are sampled once per VIDEO frame (16 a second) however often the page
// manages to run: a page drawing 8 times a second takes two samples a tick, so a key is recorded as long as it
// was held.
"use strict";
window.lingbotKeys = (() => {
  const FPS = 16;
  const FRAME_MS = 1000 / FPS;
  const KEYS = "wasdijkl";
  const MAX_CATCH_UP = FPS; // after a stall (a hidden tab) at most a second of samples is made up

  function union(a, b) {
    return [...KEYS].filter((k) => a.includes(k) || b.includes(k)).join("");
  }
  // At most n samples: the oldest folded together into one (a key tapped in any of them still counts once).
  function foldTo(samples, n) {
    while (samples.length > n && samples.length > 1) samples.splice(0, 2, union(samples[0], samples[1]));
  }
  function actionString(samples) {
    const out = [];
    for (const k of samples) {
      const last = out[out.length - 1];
      if (last && last.k === k) last.n += 1; else out.push({ k, n: 1 });
    }
    return out.map((s) => `${s.k || "none"}-${s.n}`).join(",");
  }
  // The next chunk's keys from the samples since the last request (oldest first) and the keys held now: more
  // samples than the chunk takes keep the latest, the older folded into the first kept (a tap still counts once);
  // fewer are followed by the keys held now.
  function takeKeys(samples, need, heldNow) {
    if (!need) return [];
    const s = samples.slice();
    foldTo(s, need);
    while (s.length < need) s.push(heldNow);
    return s;
  }
  // Ask now? Always when the server is slower than playback; when it is faster, only once the frames queued play
  // out within its latency (`lead` seconds), so the next chunk's keys are as fresh as can be and the queue stays short.
  function asksNow(queuedFrames, lead) {
    return queuedFrames / FPS <= lead;
  }
  // The video-frame clock of the samples: `due(now)` is how many video frames began since the last call (each
  // gets one sample); `start(now)` restarts it (Play, a new video). atLeastOne: a request about to leave takes
  // the keys of this moment even between two frames (the clock then runs that frame ahead).
  function frameClock() {
    let at = null;
    return {
      start(now) { at = now; },
      due(now, atLeastOne) {
        if (at === null) at = now;
        let n = Math.floor((now - at) / FRAME_MS);
        if (n > MAX_CATCH_UP) { at = now - MAX_CATCH_UP * FRAME_MS; n = MAX_CATCH_UP; }
        if (atLeastOne && n < 1) n = 1;
        at += Math.max(n, 0) * FRAME_MS;
        return Math.max(n, 0);
      },
    };
  }
  return { FPS, FRAME_MS, KEYS, union, foldTo, actionString, takeKeys, asksNow, frameClock };
})();
