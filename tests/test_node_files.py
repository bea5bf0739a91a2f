"""Where each node is (issue 46): `LingBot<Word>...` is in nodes/<word>.py, <word> being the first word of the class
name after `LingBot`, in lower case and without a plural s (a run of capitals such as VAE is one word). Every file at
the top of nodes/ is such a family file; nodes/adapters/ (what the families share to talk to ComfyUI) holds no node."""
import ast
import re
from pathlib import Path

from lingbot_world.nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

NODES = Path(__file__).resolve().parents[1] / "nodes"

# The 21 nodes and their files, written out: a new node is added here, in the file the rule gives it.
FILES = {
    "LingBotActions": "action",
    "LingBotCameraConditioning": "camera",
    "LingBotCameraFromFiles": "camera",
    "LingBotCameraPreset": "camera",
    "LingBotExpertLoader": "expert",
    "LingBotExpertsFromModels": "expert",
    "LingBotFastContinue": "fast",
    "LingBotFastLoader": "fast",
    "LingBotFastLoraLoader": "fast",
    "LingBotFastSampler": "fast",
    "LingBotImageToVideo": "image",
    "LingBotImageToVideoNative": "image",
    "LingBotLoraLoader": "lora",
    "LingBotModelLoader": "model",
    "LingBotPlay": "play",
    "LingBotSampler": "sampler",
    "LingBotSaveCamera": "save",
    "LingBotSpeedOptions": "speed",
    "LingBotTextEncode": "text",
    "LingBotVAEDecode": "vae",
    "LingBotVAELoader": "vae",
}


def family(class_name: str) -> str:
    """The rule: the first word after `LingBot`, lower case, without a plural s."""
    assert class_name.startswith("LingBot"), class_name
    word = re.match(r"[A-Z]+(?=[A-Z][a-z]|$)|[A-Z][a-z0-9]*", class_name[len("LingBot"):]).group(0).lower()
    return word[:-1] if word.endswith("s") else word


def _node_classes(path: Path) -> list[str]:
    """Classes of a file that ComfyUI could run: they define INPUT_TYPES and FUNCTION."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            names |= {t.id for n in node.body if isinstance(n, ast.Assign)
                      for t in n.targets if isinstance(t, ast.Name)}
            if {"INPUT_TYPES", "FUNCTION"} <= names:
                out.append(node.name)
    return out


def test_the_rule_gives_each_node_its_file():
    assert family("LingBotVAEDecode") == "vae" and family("LingBotExpertsFromModels") == "expert"
    assert family("LingBotImageToVideoNative") == "image" and family("LingBotActions") == "action"
    assert {name: family(name) for name in FILES} == FILES


def test_every_registered_node_is_in_its_file():
    assert sorted(NODE_CLASS_MAPPINGS) == sorted(FILES) == sorted(NODE_DISPLAY_NAME_MAPPINGS)
    for name, cls in NODE_CLASS_MAPPINGS.items():
        package, module = cls.__module__.rsplit(".", 1)
        assert cls.__name__ == name and package.endswith(".nodes") and module == FILES[name], (name, cls.__module__)


def test_top_level_files_are_families_and_adapters_hold_no_node():
    for path in sorted(NODES.glob("*.py")):
        if path.name == "__init__.py":
            continue
        held = _node_classes(path)
        assert held, f"nodes/{path.name} holds no node: shared code goes to nodes/adapters/"
        assert all(FILES.get(name) == path.stem for name in held), (path.name, held)
    for path in sorted((NODES / "adapters").glob("*.py")):
        assert not _node_classes(path), f"nodes/adapters/{path.name} holds a node: move it to its family file"
