"""Convert a UI-format workflow (what the ComfyUI frontend saves) into the API format `/prompt` runs.

ComfyUI's server has no such converter (only the frontend does it), but tests and headless runs need one.
The rules follow the frontend: `widgets_values` are positional, in the order the node declares its
widget inputs (required, then optional); INT inputs with `control_after_generate` (and legacy `seed` /
`noise_seed`) carry one extra control value ("fixed", "randomize", ...); image-upload combos carry an
extra "upload" value. Linked inputs become `[source_id, slot]`. Frontend-only nodes (notes, reroutes)
are skipped. Node definitions come from `/object_info`, or from V1 classes via `v1_node_info`.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
FRONTEND_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
SEED_NAMES = {"seed", "noise_seed"}
BYPASSED = 4  # node mode


class WorkflowError(ValueError):
    """The workflow does not fit the node definitions (unknown type, wrong widget count, bad link)."""


def is_widget(spec: Any) -> bool:
    kind = spec[0]
    if isinstance(kind, list):
        return True
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return kind in WIDGET_TYPES and not opts.get("forceInput", False)


def _opts(spec: Any) -> dict:
    return spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}


def widget_inputs(node_def: Mapping) -> list[tuple[str, Any]]:
    """(name, spec) of the widget inputs in widgets_values order."""
    out = []
    for section in ("required", "optional"):
        specs = node_def["input"].get(section, {})
        for name in node_def.get("input_order", {}).get(section, list(specs)):
            if is_widget(specs[name]):
                out.append((name, specs[name]))
    return out


def extra_values(name: str, spec: Any) -> int:
    """How many UI-only values follow this widget's value in widgets_values."""
    opts = _opts(spec)
    if spec[0] == "INT" and (opts.get("control_after_generate") or name in SEED_NAMES):
        return 1
    if opts.get("image_upload") or opts.get("video_upload") or opts.get("audio_upload"):
        return 1
    return 0


def combo_options(spec: Any) -> list | None:
    if isinstance(spec[0], list):
        return spec[0]
    if spec[0] == "COMBO":
        return list(_opts(spec).get("options", []))
    return None


def check_widget_value(node_type: str, name: str, spec: Any, value: Any, check_combo: bool = True) -> None:
    """What the frontend would refuse: wrong type, out of range, not in a combo list."""
    kind, opts = spec[0], _opts(spec)
    where = f"{node_type}.{name} = {value!r}"
    options = combo_options(spec)
    if options is not None:
        if check_combo and value not in options:
            raise WorkflowError(f"{where} is not one of {options[:12]}")
        return
    if kind == "BOOLEAN" and not isinstance(value, bool):
        raise WorkflowError(f"{where} is not a boolean")
    if kind == "STRING" and not isinstance(value, str):
        raise WorkflowError(f"{where} is not a string")
    if kind in ("INT", "FLOAT"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "INT" and value != int(value)):
            raise WorkflowError(f"{where} is not a number of type {kind}")
        if "min" in opts and value < opts["min"] or "max" in opts and value > opts["max"]:
            raise WorkflowError(f"{where} is outside [{opts.get('min')}, {opts.get('max')}]")


def ui_to_api(ui: Mapping, object_info: Mapping, unchecked: Collection[str] = ()) -> dict:
    """API prompt {id: {class_type, inputs, _meta}} for the executable nodes of a UI workflow.

    unchecked: "NodeType.input" combos whose membership is not checked (model and image lists depend on the
    files installed where the check runs).
    """
    links = {l[0]: l for l in ui.get("links", [])}
    nodes = {n["id"]: n for n in ui["nodes"]}
    api: dict = {}
    for node in ui["nodes"]:
        kind = node["type"]
        if kind in FRONTEND_ONLY or node.get("mode", 0) == BYPASSED:
            continue
        if kind not in object_info:
            raise WorkflowError(f"node {node['id']}: type {kind!r} is not installed")
        node_def = object_info[kind]
        values = list(node.get("widgets_values") or [])
        inputs: dict = {}
        pos = 0
        for name, spec in widget_inputs(node_def):
            if pos >= len(values):
                raise WorkflowError(f"node {node['id']} ({kind}): widgets_values has {len(values)} entries, "
                                    f"too few for widget {name!r}")
            check_widget_value(kind, name, spec, values[pos], check_combo=f"{kind}.{name}" not in unchecked)
            inputs[name] = values[pos]
            pos += 1 + extra_values(name, spec)
        if pos != len(values):
            raise WorkflowError(f"node {node['id']} ({kind}): {len(values)} widget values, the node declares {pos}")
        for slot, entry in enumerate(node.get("inputs", [])):
            link_id = entry.get("link")
            if link_id is None:
                continue
            src, src_slot = _source(link_id, node, slot, entry, links, nodes, object_info)
            inputs[entry["name"]] = [str(src), src_slot]
        required = node_def["input"].get("required", {})
        missing = [n for n in required if n not in inputs]
        if missing:
            raise WorkflowError(f"node {node['id']} ({kind}): required input(s) {missing} are not connected")
        api[str(node["id"])] = {"class_type": kind, "inputs": inputs,
                                "_meta": {"title": node.get("title") or node_def.get("display_name", kind)}}
    return api


def _check_link(link_id: int, node: Mapping, slot: int, links: Mapping, nodes: Mapping, object_info: Mapping) -> list:
    """The link entering `node`'s input `slot`, checked both ways (the frontend repairs, and rewrites on load, a link
    whose ends disagree with the nodes' own lists)."""
    if link_id not in links:
        raise WorkflowError(f"node {node['id']}: input slot {slot} refers to missing link {link_id}")
    _, src, src_slot, dst, dst_slot, ltype = links[link_id]
    if dst != node["id"] or src not in nodes:
        raise WorkflowError(f"link {link_id} does not connect node {src} to node {node['id']}")
    if dst_slot != slot:
        raise WorkflowError(f"link {link_id} says it enters input slot {dst_slot} of node {node['id']}, but that node "
                            f"lists it on slot {slot} ({node['inputs'][slot]['name']!r})")
    outputs = nodes[src].get("outputs") or []
    if src_slot >= len(outputs) or link_id not in (outputs[src_slot].get("links") or []):
        raise WorkflowError(f"link {link_id} leaves output {src_slot} of node {src}, which does not list it")
    src_def = object_info.get(nodes[src]["type"])
    if src_def is not None and src_def["output"][src_slot] != ltype:
        raise WorkflowError(f"link {link_id}: source output is {src_def['output'][src_slot]}, link says {ltype}")
    return links[link_id]


def _source(link_id: int, node: Mapping, slot: int, entry: Mapping, links: Mapping, nodes: Mapping,
            object_info: Mapping) -> tuple[int, int]:
    """(node id, output slot) feeding an input; a bypassed node passes its first input of the link's type through,
    as the frontend does."""
    _, src, src_slot, _, _, ltype = _check_link(link_id, node, slot, links, nodes, object_info)
    seen = set()
    while nodes[src].get("mode", 0) == BYPASSED and src not in seen:
        seen.add(src)
        through = [(i, e) for i, e in enumerate(nodes[src].get("inputs", []))
                   if e.get("type") == ltype and e.get("link") is not None]
        if not through:
            raise WorkflowError(f"node {src} is bypassed but has no {ltype} input to pass to node {node['id']}")
        i, e = through[0]
        _, src, src_slot, _, _, _ = _check_link(e["link"], nodes[src], i, links, nodes, object_info)
    return src, src_slot


def v1_node_info(name: str, cls: Any, display_name: str = "") -> dict:
    """An /object_info-like entry for a V1 node class (for tests without a server)."""
    types = cls.INPUT_TYPES()
    return {
        "input": types,
        "input_order": {k: list(v) for k, v in types.items()},
        "output": list(cls.RETURN_TYPES),
        "output_name": list(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)),
        "name": name,
        "display_name": display_name or name,
        "category": getattr(cls, "CATEGORY", ""),
        "output_node": bool(getattr(cls, "OUTPUT_NODE", False)),
    }
