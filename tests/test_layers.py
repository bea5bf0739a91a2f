"""The layers, checked mechanically (issue 46): quant/ -> wan/ -> loaders/, speed/ -> memory/, text_encoder/,
parallel/ -> world/ -> the doors cli/, nodes/, player/. Every relative import of the package's code (at the top of a
module or inside a function) points down or sideways within its own layer, never up; and the doors reach the layers
below the world through world/ except for a few modules (a door translates; it does not assemble).

Each module is parsed with `ast`; nothing is imported.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = [("quant",), ("wan",), ("loaders", "speed"), ("memory", "text_encoder", "parallel"), ("world",),
          ("cli", "nodes", "player")]
RANK = {top: i for i, layer in enumerate(LAYERS) for top in layer}
DOORS = LAYERS[-1]
BELOW_THE_WORLD = [top for layer in LAYERS[:-2] for top in layer]
# The most modules below the world that the doors together import directly (it was 54 before issue 46).
DOOR_REACH_MAX = 30


def _imports(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, the imported module's path inside the package) of every relative import in `path`; for `from . import
    x` the module x when it is one, else its package."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.ImportFrom) or not node.level or node.level - 1 > len(package):
            continue
        base = package[:len(package) - (node.level - 1)] + tuple((node.module or "").split(".") if node.module else ())
        for alias in node.names:
            name = base + (alias.name,)
            is_module = (ROOT.joinpath(*name).with_suffix(".py").is_file()
                         or ROOT.joinpath(*name, "__init__.py").is_file())
            found.append((node.lineno, name if is_module else base))
    return found


def _modules(tops) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def _reach(door: str) -> set[str]:
    return {".".join(name) for path in _modules([door]) for _, name in _imports(path)
            if name and name[0] in BELOW_THE_WORLD}


def test_no_import_points_up():
    up = []
    for path in _modules(RANK):
        own = path.relative_to(ROOT).parts[0]
        for line, name in _imports(path):
            other = name[0] if name else None
            if other in RANK and other != own and RANK[other] > RANK[own]:
                up.append(f"{path.relative_to(ROOT)}:{line} imports {'.'.join(name)}")
    assert not up, "imports that point to a higher layer:\n" + "\n".join(up)


def test_the_doors_reach_below_the_world_through_it():
    reach = {door: _reach(door) for door in DOORS}
    total = set().union(*reach.values())
    assert len(total) <= DOOR_REACH_MAX, {door: sorted(modules) for door, modules in reach.items()}
    assert not reach["player"]  # the player is handed its session: it imports nothing below the world


@pytest.mark.parametrize("door", DOORS)
def test_a_door_imports_no_other_door_but_the_player(door):
    """cli/ and nodes/ serve the player's page (play); nothing else crosses between doors."""
    crossing = [f"{path.relative_to(ROOT)}:{line} imports {'.'.join(name)}" for path in _modules([door])
                for line, name in _imports(path) if name and name[0] in DOORS and name[0] not in (door, "player")]
    assert not crossing, "\n".join(crossing)


def test_the_checks_read_imports():
    """The reader itself: a relative import inside a function is seen, and `from .. import x` names the module x."""
    assert ("speed", "plans") in [name for _, name in _imports(ROOT / "world" / "speed.py")]
    inner = [name for _, name in _imports(ROOT / "cli" / "generate_causal.py")]
    assert ("world", "first_part") in inner  # imported inside _first_part
    assert ("world", "heavy_imports") in inner  # `from ..world import heavy_imports`
