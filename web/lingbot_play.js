// LingBot Play panel: when a LingBot Play node has run, its player page (served by the pack on ComfyUI's own server
// under /lingbot_world/play/<node>/, token in the URL) opens in a floating panel over the graph. The page is the
// same code as `lingbot-world play`'s (player/static). "Send keys to graph" queues the workflow again, so the node
// outputs the keys played so far. Closing the panel keeps the session (reopen it from the node's button); "Free
// model and node cache" (Edit -> Unload Models and Execution Cache in newer menus) closes it on the server, which
// tells the panel (lingbot_world.play_closed): it then says so over the player, with Play and Send disabled, until
// a Run opens a new session.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const PANEL_ID = "lingbot-play-panel";
const CLOSED_ID = "lingbot-play-closed";
export const FREED = "Session closed, models freed: press Run to play again.";
const urls = new Map(); // node id -> the player's URL (with its token)

// The session of `node` is gone (Free): the panel says so over the player and nothing in it can be pressed.
function showClosed(node, text) {
  urls.delete(String(node));
  const panel = document.getElementById(PANEL_ID);
  if (!panel || panel.dataset.node !== String(node)) return;
  panel.dataset.closed = "1";
  const frame = panel.querySelector("iframe");
  try { // same origin: the page's own buttons too (its socket is closing, it would say "disconnected")
    const doc = frame?.contentDocument;
    for (const b of doc?.querySelectorAll("button") ?? []) b.disabled = true;
    doc?.getElementById("note")?.replaceChildren(doc.createTextNode(text));
  } catch (e) { /* not loaded yet */ }
  if (frame) frame.style.pointerEvents = "none";
  panel.querySelector("[data-lingbot-send]")?.setAttribute("disabled", "");
  let cover = document.getElementById(CLOSED_ID);
  if (!cover) {
    cover = document.createElement("div");
    cover.id = CLOSED_ID;
    cover.setAttribute("role", "status");
    Object.assign(cover.style, {
      position: "absolute", left: 0, right: 0, top: "34px", bottom: 0, display: "flex", alignItems: "center",
      justifyContent: "center", background: "rgba(21,23,26,.86)", color: "#eee", font: "16px sans-serif",
      textAlign: "center", padding: "24px",
    });
    panel.append(cover);
  }
  cover.textContent = text;
}

function closePanel() {
  document.getElementById(PANEL_ID)?.remove();
}

function openPanel(node) {
  const url = urls.get(String(node));
  if (!url) return;
  closePanel();
  const panel = document.createElement("div");
  panel.id = PANEL_ID;
  panel.dataset.node = String(node);
  Object.assign(panel.style, {
    position: "fixed", right: "16px", bottom: "16px", width: "min(1180px, 92vw)", height: "min(760px, 86vh)",
    zIndex: 10000, background: "#15171a", border: "1px solid #444", borderRadius: "8px",
    boxShadow: "0 8px 30px rgba(0,0,0,.6)", display: "flex", flexDirection: "column", resize: "both",
    overflow: "hidden", boxSizing: "border-box",
  });
  const bar = document.createElement("div");
  Object.assign(bar.style, { display: "flex", gap: "8px", alignItems: "center", padding: "4px 8px", color: "#ddd",
                             font: "13px sans-serif", borderBottom: "1px solid #333" });
  const title = document.createElement("span");
  title.textContent = `LingBot Play (node ${node}): click the video, hold W A S D / I J K L`;
  title.style.flex = "1";
  const send = document.createElement("button");
  send.textContent = "Send keys to graph";
  send.title = "Queue the workflow again: LingBot Play outputs the keys played so far as an action string";
  send.dataset.lingbotSend = "1";
  send.onclick = () => app.queuePrompt(0, 1);
  const close = document.createElement("button");
  close.textContent = "Close";
  close.title = "Hide the panel (the session stays open until its inputs change or the node cache is freed)";
  close.onclick = closePanel;
  bar.append(title, send, close);
  const frame = document.createElement("iframe");
  frame.src = url;
  frame.title = "LingBot Play";
  Object.assign(frame.style, { flex: "1", border: "0", width: "100%" });
  panel.append(bar, frame);
  document.body.append(panel);
  frame.focus();
}

app.registerExtension({
  name: "lingbot_world.play",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== "LingBotPlay") return;
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = created?.apply(this, arguments);
      this.addWidget("button", "open player", null, () => {
        if (urls.has(String(this.id))) openPanel(this.id);
        else alert("Queue the workflow first: LingBot Play opens its session when it runs.");
      });
      return r;
    };
  },
  setup() {
    api.addEventListener("lingbot_world.play_closed", ({ detail }) => {
      if (detail?.reason === "freed") showClosed(detail.node, FREED);
      else urls.delete(String(detail?.node));
    });
    api.addEventListener("executed", ({ detail }) => {
      const info = detail?.output?.lingbot_play?.[0];
      if (!info) return;
      const node = String(info.node ?? detail.node);
      const changed = urls.get(node) !== info.url;
      urls.set(node, info.url);
      const open = document.getElementById(PANEL_ID);
      if (changed || !open) openPanel(node); // a new session (or none shown): open it; else keep playing
    });
  },
});
