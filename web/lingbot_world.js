// LingBot-World frontend extension: acts on hints that nodes declare in their input options (nodes/adapters/ui_hints.py), so
// any node of the pack gets the behaviour from one line in its INPUT_TYPES:
//   lingbot_show_if: {widget: [values]}  the widget is shown only while each named widget holds one of the values
//   lingbot_hide_if: {widget: [values]}  the widget is hidden while any named widget holds one of the values
//   lingbot_short_labels: true           a path combo shows the shortest distinct end of each path
//   lingbot_upload: "camera_npy"          an upload button for poses.npy + intrinsics.npy (a new trajectory folder)
// It also sorts the pack's templates (demos first) and keeps the node text from breaking words apart.
// Nothing here changes what a workflow stores or what the server receives. Works with the classic canvas and with
// the Vue node renderer ("Nodes 2.0"), whose widgets also follow `widget.hidden` (current ComfyUI's own extensions
// set it); there the conditional widgets are "advanced" ones too (nodes/adapters/ui_hints.py).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const SHOW_IF = "lingbot_show_if";
const HIDE_IF = "lingbot_hide_if";
const SHORT_LABELS = "lingbot_short_labels";
const UPLOAD = "lingbot_upload";
const TRAJECTORY_UPLOADS = "lingbot_trajectories";

function inputOptions(nodeData) {
  const out = {};
  for (const section of ["required", "optional"]) {
    for (const [name, spec] of Object.entries(nodeData?.input?.[section] ?? {})) {
      if (Array.isArray(spec) && spec[1] && typeof spec[1] === "object") out[name] = spec[1];
    }
  }
  return out;
}

// value -> the shortest "/"-separated tail that no other value ends with ("a/b/c" -> "c", or "b/c" on a clash).
export function shortLabels(values) {
  const parts = values.map((v) => String(v).split(/[\\/]/));
  const labels = new Map();
  parts.forEach((p, i) => {
    for (let k = 1; k <= p.length; k++) {
      const tail = p.slice(-k).join("/");
      if (!parts.some((q, j) => j !== i && q.slice(-k).join("/") === tail)) {
        labels.set(values[i], tail);
        return;
      }
    }
    labels.set(values[i], String(values[i]));
  });
  return labels;
}

const widgetNamed = (node, name) => node.widgets?.find((w) => w.name === name);
const isLinked = (node, name) => !!node.inputs?.some((i) => i.widget?.name === name && i.link != null);

// `hidden` keeps the frontend from drawing the widget and counting it in the node's size; a zero computeSize keeps
// its layout from reserving a row for it.
function setHidden(widget, hide) {
  widget.hidden = hide;
  if (hide && !widget.lingbotLayout) {
    widget.lingbotLayout = { own: Object.hasOwn(widget, "computeSize"), computeSize: widget.computeSize };
    widget.computeSize = () => [0, -4];
  } else if (!hide && widget.lingbotLayout) {
    const { own, computeSize } = widget.lingbotLayout;
    if (own) widget.computeSize = computeSize;
    else delete widget.computeSize;
    delete widget.lingbotLayout;
  }
}

// keepSize: a workflow is being loaded; its saved size already fits the widgets it shows, so only grow if needed.
function applyVisibility(node, rules, keepSize = false) {
  const before = node.computeSize()[1];
  let changed = false;
  for (const [name, { show = {}, hide: hideWhen = {} }] of Object.entries(rules)) {
    const widget = widgetNamed(node, name);
    if (!widget) continue;
    // A controlling widget driven by a link has no value here: it never hides anything.
    const holds = Object.entries(show).every(([other, values]) => {
      const ctl = widgetNamed(node, other);
      return !ctl || isLinked(node, other) || values.includes(ctl.value);
    });
    const hidden = Object.entries(hideWhen).some(([other, values]) => {
      const ctl = widgetNamed(node, other);
      return !!ctl && !isLinked(node, other) && values.includes(ctl.value);
    });
    const hide = (!holds || hidden) && !isLinked(node, name);
    if (!!widget.hidden !== hide) {
      setHidden(widget, hide);
      changed = true;
    }
  }
  const [minW, minH] = node.computeSize();
  if (keepSize) {
    if (node.size[0] < minW || node.size[1] < minH) node.setSize([Math.max(node.size[0], minW), Math.max(node.size[1], minH)]);
  } else if (changed) {
    // Grow or shrink by what the widgets need; extra height the user gave the node stays.
    node.setSize([Math.max(node.size[0], minW), Math.max(minH, node.size[1] + minH - before)]);
  }
  if (changed) node.setDirtyCanvas?.(true, true);
}

function useShortLabels(widget) {
  let cacheKey = null;
  let labels = new Map();
  const label = (value) => {
    const values = widget.options?.values;
    const list = Array.isArray(values) ? values : [];
    const key = list.join("\n");
    if (key !== cacheKey) {
      cacheKey = key;
      labels = shortLabels(list);
    }
    // A value that is not installed (a shared workflow, a template before its download): the whole path, so the
    // folder it is missing from shows; the queued run says where to get it.
    return labels.get(value) ?? String(value ?? "");
  };
  // The widget draws `_displayValue` (the frontend's own hook for a shown value that differs from the stored one).
  Object.defineProperty(widget, "_displayValue", {
    configurable: true,
    get() {
      return this.computedDisabled ? "" : label(this.value);
    },
  });
}

// Templates of this pack in the browser: the runnable demos first, then by title (the server lists files in
// directory order).
export function sortTemplateNames(names) {
  const demo = (n) => (/^tiny cpu demo/i.test(n) ? 0 : 1);
  return [...names].sort((a, b) => demo(a) - demo(b) || a.localeCompare(b, "en", { numeric: true }));
}

function sortOwnTemplates() {
  const original = api.getWorkflowTemplates;
  if (typeof original !== "function" || original.lingbotSorted) return;
  const sorted = async function (...args) {
    const all = await original.apply(this, args);
    for (const [module, names] of Object.entries(all ?? {})) {
      if (/lingbot/i.test(module) && Array.isArray(names)) all[module] = sortTemplateNames(names);
    }
    return all;
  };
  sorted.lingbotSorted = true;
  api.getWorkflowTemplates = sorted;
}

// The frontend's node text (progress text) breaks lines anywhere ("break-all"): "LingBot" became "LingB / ot".
// Words stay whole; a long path still wraps where it must.
function keepWordsWhole() {
  if (document.getElementById("lingbot-node-text")) return;
  const style = document.createElement("style");
  style.id = "lingbot-node-text";
  style.textContent = ".break-all.flex.items-center > span { word-break: normal; overflow-wrap: anywhere; }";
  document.head.append(style);
}

function toast(severity, summary, detail) {
  const t = app.extensionManager?.toast;
  if (t?.add) t.add({ severity, summary, detail, life: severity === "error" ? 8000 : 4000 });
  else if (severity === "error") window.alert(`${summary}: ${detail}`);
}

async function uploadOne(file, name, subfolder) {
  const body = new FormData();
  body.append("image", file, name); // ComfyUI's upload endpoint stores any file under input/
  body.append("subfolder", subfolder);
  body.append("type", "input");
  body.append("overwrite", "true");
  const resp = await api.fetchApi("/upload/image", { method: "POST", body });
  if (resp.status !== 200) throw new Error(`${name}: the server answered ${resp.status} ${resp.statusText}`);
}

// Two .npy files -> input/lingbot_trajectories/<stem>/{poses,intrinsics}.npy, then selected in the combo.
export async function uploadTrajectory(node, comboName, files) {
  files = Array.from(files ?? []);
  const poses = files.find((f) => /pose/i.test(f.name));
  const intrinsics = files.find((f) => /intrinsic/i.test(f.name));
  if (files.length !== 2 || !poses || !intrinsics || poses === intrinsics) {
    throw new Error("choose two .npy files: one named like poses.npy and one like intrinsics.npy");
  }
  const stamp = new Date().toISOString().replace(/[-:Z]/g, "").replace("T", "_").replace(".", "_");
  const folder = `${TRAJECTORY_UPLOADS}/upload_${stamp}`;
  await uploadOne(poses, "poses.npy", folder);
  await uploadOne(intrinsics, "intrinsics.npy", folder);
  const resp = await api.fetchApi(`/object_info/${encodeURIComponent(node.comfyClass)}`, { cache: "no-store" });
  const spec = (await resp.json())?.[node.comfyClass]?.input?.required?.[comboName];
  const combo = widgetNamed(node, comboName);
  if (Array.isArray(spec?.[0])) combo.options.values = spec[0];
  if (!combo.options.values.includes(folder)) throw new Error(`${folder} did not appear in the list`);
  combo.value = folder;
  combo.callback?.(folder);
  node.setDirtyCanvas?.(true, true);
  return folder;
}

function addUploadButton(node, comboName, kind) {
  if (kind !== "camera_npy") return;
  const input = document.createElement("input");
  Object.assign(input, { type: "file", multiple: true, accept: ".npy" });
  input.style.display = "none";
  input.dataset.lingbotUpload = comboName;
  input.onchange = async () => {
    try {
      const folder = await uploadTrajectory(node, comboName, input.files);
      toast("success", "Trajectory uploaded", `input/${folder}`);
    } catch (e) {
      toast("error", "LingBot-World upload", String(e?.message ?? e));
    } finally {
      input.value = "";
    }
  };
  document.body.append(input);
  // Last widget, not serialized: the stored widget values keep their positions.
  const button = node.addWidget("button", "upload poses.npy + intrinsics.npy", null, () => input.click(),
    { serialize: false });
  button.serialize = false;
  node.lingbotUploadInput = input;
  const onRemoved = node.onRemoved;
  node.onRemoved = function () {
    input.remove();
    return onRemoved?.apply(this, arguments);
  };
}

app.registerExtension({
  name: "LingBotWorld.NodeUI",
  init() {
    sortOwnTemplates();
    keepWordsWhole();
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    const options = inputOptions(nodeData);
    const rules = {};
    const short = [];
    const uploads = [];
    for (const [name, opts] of Object.entries(options)) {
      if (opts[SHOW_IF] || opts[HIDE_IF]) rules[name] = { show: opts[SHOW_IF], hide: opts[HIDE_IF] };
      if (opts[SHORT_LABELS]) short.push(name);
      if (opts[UPLOAD]) uploads.push([name, opts[UPLOAD]]);
    }
    const hasRules = Object.keys(rules).length > 0;
    if (!hasRules && !short.length && !uploads.length) return;
    const controls = [...new Set(Object.values(rules).flatMap((r) => [...Object.keys(r.show ?? {}), ...Object.keys(r.hide ?? {})]))];

    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      for (const name of short) {
        const w = widgetNamed(this, name);
        if (w) useShortLabels(w);
      }
      for (const [name, kind] of uploads) addUploadButton(this, name, kind);
      if (hasRules) {
        for (const name of controls) {
          const w = widgetNamed(this, name);
          if (!w) continue;
          const callback = w.callback;
          const node = this;
          w.callback = function () {
            const out = callback?.apply(this, arguments);
            applyVisibility(node, rules);
            return out;
          };
        }
        applyVisibility(this, rules);
      }
      return r;
    };
    if (!hasRules) return;
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function () {
      const r = onConfigure?.apply(this, arguments);
      applyVisibility(this, rules, true); // after a workflow set the widget values and the size
      return r;
    };
    const onConnectionsChange = nodeType.prototype.onConnectionsChange;
    nodeType.prototype.onConnectionsChange = function () {
      const r = onConnectionsChange?.apply(this, arguments);
      applyVisibility(this, rules);
      return r;
    };
  },
});
