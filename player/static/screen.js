// LingBot-World player: where a frame from the server goes and what the page's clock reports when one reaches the
// screen, free of the page's DOM and socket (player.js uses it; the browser test calls it directly). A chunk's
// preview (its frames after the first denoising step, marked by the top bit of the header's frame word:
// player/frames.py) plays like any frame until the chunk's real frames come. A real frame then takes its preview's
// place in the queue, or redraws the screen when its preview is the frame on it, or is dropped when its preview has
// already played (the video does not go back in time).
"use strict";
window.lingbotScreen = (() => {
  const PREVIEW_BIT = 0x80000000;
  const HEADER_BYTES = 8;

  // uint32 BE chunk | uint32 BE frame (top bit: preview) | JPEG
  function header(buf) {
    const view = new DataView(buf);
    const word = view.getUint32(4);
    return { chunk: view.getUint32(0), frame: word & ~PREVIEW_BIT, preview: (word & PREVIEW_BIT) !== 0 };
  }

  // A real frame `item` {chunk, frame} against the queue and the frame on screen: "replaced" (it took its
  // preview's place in the queue), "redraw" (its preview is on screen: draw it now), "past" (its preview was shown
  // and the video has moved on), "queued" (no preview of it: pushed to the queue's end).
  function placeReal(queue, onScreen, item) {
    const i = queue.findIndex((q) => q.preview && q.chunk === item.chunk && q.frame === item.frame);
    if (i >= 0) {
      queue[i] = item;
      return "replaced";
    }
    if (onScreen && onScreen.preview && onScreen.chunk === item.chunk && item.frame <= onScreen.frame) {
      return item.frame === onScreen.frame ? "redraw" : "past";
    }
    queue.push(item);
    return "queued";
  }

  // The timing report (player/timings.py) for `item` reaching the screen at `now`, or null when there is nothing
  // new: a chunk's preview once (request / key -> preview), its first real frame once (request -> arrival and
  // -> screen, key -> screen; and key -> preview too when the real frames overtook the preview). `requests`: chunk
  // -> {sentAt, arrivedAt, previewAt, previewShownAt, keyChange}, the page's clock of each chunk asked for; a chunk's
  // record goes once its real frames are on screen.
  function screenReport(requests, item, now, fps) {
    const r = requests[item.chunk];
    if (!r) return null;
    const since = (t) => (t ? (now - t) / 1000 : null); // a key change, if any
    if (item.preview) {
      if (r.previewShownAt !== undefined) return null;
      r.previewShownAt = now;
      return { op: "timing", chunk: item.chunk, request_to_preview_s: (now - r.sentAt) / 1000,
        key_to_preview_s: since(r.keyChange) };
    }
    delete requests[item.chunk];
    const report = { op: "timing", chunk: item.chunk, request_to_arrival_s: ((r.arrivedAt || now) - r.sentAt) / 1000,
      request_to_screen_s: (now - r.sentAt) / 1000, key_to_screen_s: since(r.keyChange), fps };
    if (r.previewAt !== undefined && r.previewShownAt === undefined) {
      report.request_to_preview_s = report.request_to_screen_s;
      report.key_to_preview_s = report.key_to_screen_s;
    }
    return report;
  }

  return { header, placeReal, screenReport, HEADER_BYTES };
})();
