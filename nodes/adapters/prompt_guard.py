"""A prompt whose LingBot model choice fails its check runs nothing, so ComfyUI shows the pack's message.

ComfyUI queues a prompt as soon as ONE output validates and quietly drops the others: a template whose camera-path
preview needs no model then "succeeds" with only that preview, the loaders get a red outline and the history says
success. This `on_prompt` handler (ComfyUI calls it before validating) runs the pack's VALIDATE_INPUTS checks (model
files, quick) and, when one fails, holds back the outputs that depend on the pack's nodes but not on the failing one.
ComfyUI then finds no valid output and answers with its error dialog, which lists the pack's message for each failing
node. Outputs that use none of the pack's nodes are left alone. No ComfyUI import here: the caller passes the classes.
"""
from __future__ import annotations

import inspect
import logging
from typing import Callable, Mapping

log = logging.getLogger(__name__)


def _is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)


def failing_nodes(prompt: Mapping[str, dict], pack_classes: Mapping[str, type]) -> dict[str, str]:
    """{node id: message} for the pack's nodes whose VALIDATE_INPUTS refuses their widget values."""
    failing = {}
    for node_id, node in prompt.items():
        cls = pack_classes.get(node.get("class_type"))
        check = getattr(cls, "VALIDATE_INPUTS", None)
        if check is None:
            continue
        inputs = node.get("inputs", {})
        names = [n for n in inspect.signature(check).parameters]
        try:
            verdict = check(**{n: None if _is_link(inputs.get(n)) else inputs.get(n) for n in names})
        except Exception as e:  # ComfyUI reports it when it validates; nothing to decide here
            log.debug("LingBot-World: checking node %s failed: %s", node_id, e)
            continue
        if verdict is not True:
            failing[node_id] = str(verdict)
    return failing


def upstream(prompt: Mapping[str, dict], node_id: str) -> set[str]:
    """The node and every node it reads from."""
    seen, todo = set(), [node_id]
    while todo:
        nid = todo.pop()
        if nid in seen or nid not in prompt:
            continue
        seen.add(nid)
        todo += [str(v[0]) for v in prompt[nid].get("inputs", {}).values() if _is_link(v)]
    return seen


def held_back_outputs(prompt: Mapping[str, dict], pack_classes: Mapping[str, type],
                      is_output: Callable[[str], bool]) -> list[str]:
    """Output nodes to drop: they use the pack's nodes, none of which fails, while another pack node fails."""
    failing = failing_nodes(prompt, pack_classes)
    if not failing:
        return []
    held = []
    for node_id, node in prompt.items():
        if not is_output(node.get("class_type")):
            continue
        above = upstream(prompt, node_id)
        uses_pack = any(prompt[n].get("class_type") in pack_classes for n in above)
        if uses_pack and not above & failing.keys():
            held.append(node_id)
    return held


def make_handler(pack_classes: Mapping[str, type], all_classes: Mapping[str, type]):
    """The on_prompt handler for PromptServer.add_on_prompt_handler."""
    def is_output(class_type: str) -> bool:
        return bool(getattr(all_classes.get(class_type), "OUTPUT_NODE", False))

    def handler(json_data: dict) -> dict:
        prompt = json_data.get("prompt")
        if not isinstance(prompt, dict):
            return json_data
        held = held_back_outputs(prompt, pack_classes, is_output)
        if held:
            log.warning("LingBot-World: a model choice is missing or wrong; not running output node(s) %s either, so "
                        "ComfyUI shows the message instead of a partial run", ", ".join(held))
            json_data = dict(json_data, prompt={k: v for k, v in prompt.items() if k not in held})
        return json_data

    return handler


def install(pack_classes: Mapping[str, type]) -> bool:
    """Register the handler with ComfyUI's server (inside ComfyUI only); False when there is no server."""
    import sys

    comfy_nodes = sys.modules.get("nodes")  # ComfyUI's own node module: it is the one loading this pack
    try:
        from server import PromptServer
    except ImportError:
        return False
    server = getattr(PromptServer, "instance", None)
    mappings = getattr(comfy_nodes, "NODE_CLASS_MAPPINGS", None)
    if server is None or not hasattr(server, "add_on_prompt_handler") or not isinstance(mappings, dict):
        return False
    server.add_on_prompt_handler(make_handler(pack_classes, mappings))
    return True
