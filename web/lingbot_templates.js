// LingBot-World in ComfyUI's template browser and error dialog (both the 1.2x frontends and the current ones):
// - the pack's templates: the first one to open first, then the runnable demos, then by title (the server lists the
//   files in directory order), each card with a one-line description instead of its title repeated (the frontends
//   take a custom node's template description from its file name), the browser's heading with the pack's display
//   name instead of its folder's;
// - a refused prompt: ComfyUI repeats a node's check message under every input the check reads (the Expert Loader's
//   under both experts and the download switch); the pack's message is shown once per node, its inputs named.
// Nothing here changes a workflow or what the server runs.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";

export const FIRST = "Image to video, camera preset";
export const DESCRIPTIONS = {
  "Image to video, camera preset": "Start here: a first frame, a camera preset and the base Cam model make a video.",
  "Image to video, recorded trajectory": "The base Cam model follows a recorded camera path (poses + intrinsics).",
  "Act model steered with keys": "The Act experts walk with W A S D keys from the release's example 05.",
  "Fast image to video, camera preset": "The Fast model, chunk by chunk with a K/V cache: 4 steps, no CFG.",
  "Fast model steered with keys, continued": "The Fast model walks with keys, then goes on twice with new keys.",
  "Play the Fast model live with keys": "Play the Fast model live in a panel: hold W A S D to move, I J K L to look.",
  "V2 1.3B causal model, camera preset": "The v2 1.3B causal model (CC BY-NC-SA 4.0, non-commercial) with a camera preset.",
  "Play the v2 1.3B model live in real time": "Play the v2 1.3B live with its real-time speed preset (non-commercial weights).",
  "Image to video with native KSamplers, camera preset": "The experts as native MODELs with two KSamplerAdvanced.",
  "Image to video with native KSamplers and LoRA": "Native KSamplers with a LoRA slot on each expert.",
  "Tiny CPU demo (random weights)": "The whole pipeline on tiny random weights: runs in seconds on a CPU.",
  "Tiny CPU demo with native KSamplers (random weights)": "The native KSampler graph on tiny random weights, on a CPU.",
  "Tiny CPU demo, Fast model (random weights)": "The Fast graph on a tiny random Fast model, on a CPU.",
  "Tiny CPU demo, Act model (random weights)": "The Act graph on tiny random Act experts, steered by keys.",
  "Tiny CPU demo, Play (random weights)": "The live player on a tiny random Fast model: press Run, then Play.",
  "Tiny CPU demo, v2 1.3B model (random weights)": "The v2 1.3B graph on a tiny model in its release's layout.",
};

const OURS = /lingbot/i;
export const DISPLAY_NAME = "LingBot-World (Wan 2.2)"; // pyproject's DisplayName, locales/en/main.json's category
const modules = new Set(["ComfyUI-LingBot-World"]); // the folder names the server lists our templates under

export function sortTemplateNames(names) {
  const rank = (n) => (n === FIRST ? 0 : /^tiny cpu demo/i.test(n) ? 1 : 2);
  return [...names].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b, "en", { numeric: true }));
}

function sortOwnTemplates() {
  const original = api.getWorkflowTemplates;
  if (typeof original !== "function" || original.lingbotSorted) return;
  const sorted = async function (...args) {
    const all = await original.apply(this, args);
    for (const [module, names] of Object.entries(all ?? {})) {
      if (OURS.test(module) && Array.isArray(names)) {
        modules.add(module);
        all[module] = sortTemplateNames(names);
      }
    }
    return all;
  };
  sorted.lingbotSorted = true;
  api.getWorkflowTemplates = sorted;
}

// A card shows the name as its title and, where the frontend shows a description, the name again: the second
// element holding exactly the name becomes the template's description.
function describeCards(root = document) {
  for (const [name, text] of Object.entries(DESCRIPTIONS)) {
    const leaves = [...root.querySelectorAll("p, span, div, h3, h4")].filter(
      (e) => e.childElementCount === 0 && e.textContent.trim() === name);
    const cards = new Map();
    for (const leaf of leaves) {
      const card = leaf.closest("[data-testid^='template-workflow-'], .template-card, [class*='card']") ?? leaf.parentElement;
      if (!cards.has(card)) cards.set(card, []);
      cards.get(card).push(leaf);
    }
    for (const inCard of cards.values()) {
      if (inCard.length >= 2) {
        const last = inCard[inCard.length - 1];
        last.textContent = text;
        last.dataset.lingbotDescription = "1";
      }
    }
  }
}

// The classic browser (1.2x) titles a custom node's templates with its folder name, while its menu already shows the
// localized category: the heading shows the display name too.
function nameHeadings(root = document) {
  for (const h of root.querySelectorAll("h1, h2, h3")) {
    if (h.childElementCount === 0 && modules.has(h.textContent.trim())) h.textContent = DISPLAY_NAME;
  }
}

function watchTemplateBrowser() {
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      describeCards();
      nameHeadings();
    });
  }).observe(document.body, { childList: true, subtree: true });
}

// {node: {errors: [...]}}: a LingBot node's repeated check message kept once, with every input it was under.
export function onePerNode(nodeErrors) {
  for (const entry of Object.values(nodeErrors ?? {})) {
    if (!OURS.test(entry?.class_type ?? "") || !Array.isArray(entry.errors)) continue;
    const kept = [];
    const byText = new Map();
    for (const err of entry.errors) {
      const details = String(err?.details ?? "");
      const cut = details.indexOf(" - ");
      const text = cut >= 0 ? details.slice(cut + 3) : "";
      if (err?.type !== "custom_validation_failed" || !text) {
        kept.push(err);
        continue;
      }
      const input = details.slice(0, cut);
      const first = byText.get(text);
      if (first) {
        first.inputs.push(input);
        continue;
      }
      const copy = { ...err, inputs: [input] };
      byText.set(text, copy);
      kept.push(copy);
    }
    for (const err of kept) {
      if (!err.inputs) continue;
      const text = String(err.details).slice(String(err.details).indexOf(" - ") + 3);
      // the message names its widgets itself ("fast_model: ..."): no second list in front of it
      err.details = err.inputs.some((i) => text.startsWith(i)) ? text : `${err.inputs.join(", ")} - ${text}`;
      delete err.inputs;
    }
    entry.errors = kept;
  }
  return nodeErrors;
}

function oneMessagePerNode() {
  const original = api.fetchApi;
  if (typeof original !== "function" || original.lingbotErrors) return;
  const patched = async function (route, options, ...rest) {
    const res = await original.call(this, route, options, ...rest);
    if (route !== "/prompt" || (options?.method ?? "GET").toUpperCase() !== "POST" || res.status !== 400) return res;
    let body;
    try {
      body = await res.clone().json();
    } catch {
      return res;
    }
    onePerNode(body?.node_errors);
    return new Response(JSON.stringify(body), { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  patched.lingbotErrors = true;
  api.fetchApi = patched;
}

app.registerExtension({
  name: "LingBotWorld.Templates",
  init() {
    sortOwnTemplates();
    oneMessagePerNode();
  },
  setup() {
    watchTemplateBrowser();
  },
});
