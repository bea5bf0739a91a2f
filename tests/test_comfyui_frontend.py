"""Every example workflow opened in ComfyUI's own web frontend: no missing nodes, nothing dropped.

Opt-in, like test_comfyui_server.py (same temp-base server, see tests/comfyui_server.py), and it also needs:
  - COMFYUI_PATH (and COMFYUI_PYTHON) as for the server tests;
  - Playwright's Python client in this venv (`pip install playwright`; an optional local tool, not a project
    dependency, and `playwright install` is not needed);
  - a system Chromium at /usr/bin/chromium (Debian: `apt-get install chromium`), or LINGBOT_CHROMIUM=/path.
Each is skipped with its reason when absent. The browser runs headless with a fresh profile and may only reach the
local server: other hosts fail name resolution and every request to anything else is aborted (and reported).
Set LINGBOT_FRONTEND_SCREENSHOT_DIR to keep the screenshot of the camera-preset workflow (or the one named by
LINGBOT_FRONTEND_SCREENSHOT_OF) somewhere known.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.comfyui


def _load_helper():
    spec = importlib.util.spec_from_file_location("comfyui_server", Path(__file__).with_name("comfyui_server.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


comfy = _load_helper()
if comfy.skip_reason():
    pytest.skip(comfy.skip_reason(), allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed in this venv "
                               "(`pip install playwright`; an optional local tool for this test)")
CHROMIUM = Path(os.environ.get("LINGBOT_CHROMIUM", "/usr/bin/chromium"))
if not CHROMIUM.is_file():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set LINGBOT_CHROMIUM)",
                allow_module_level=True)

WORKFLOWS = sorted((comfy.REPO / "example_workflows").glob("*.json"))
SCREENSHOT_OF = os.environ.get("LINGBOT_FRONTEND_SCREENSHOT_OF", "lingbot_world_i2v_camera_preset")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 # Belt and braces with the request filter below: no other host even resolves.
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]

# Runs in the page: load one UI workflow the way the app does, then report what the graph holds.
LOAD_AND_INSPECT = """async (workflow) => {
    const app = window.app;
    window.__lingbotMissing = null;
    await app.loadGraphData(workflow);
    const registered = window.LiteGraph.registered_node_types;
    const nodes = app.graph._nodes;
    app.graph.setDirtyCanvas(true, true);
    return {
        count: nodes.length,
        links: app.graph.links instanceof Map ? app.graph.links.size : Object.keys(app.graph.links).length,
        types: nodes.map((n) => n.type),
        unregistered: nodes.filter((n) => !registered[n.type]).map((n) => n.type),
        hasErrors: nodes.filter((n) => n.has_errors).map((n) => n.type),
        missing: window.__lingbotMissing,
    };
}"""

# An extension hook the app calls after every loadGraphData with the node types it could not create.
CAPTURE_MISSING = """() => {
    window.app.registerExtension({
        name: "lingbot.test.missingNodes",
        afterConfigureGraph(missing) { window.__lingbotMissing = (missing || []).map((m) => m.type || m); },
    });
}"""


def _close_dialogs(page) -> None:
    for _ in range(5):
        dialogs = page.locator(".p-dialog")
        if dialogs.count() == 0:
            return
        dialogs.last.locator(".p-dialog-close-button").first.click()
        page.wait_for_timeout(300)
    raise AssertionError(f"dialogs would not close: {page.locator('.p-dialog').all_inner_texts()}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy_base")
    comfy.prepare_base(base)
    with comfy.running_server(base) as srv:
        yield srv


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    allowed = ("127.0.0.1", server.port)
    blocked: list[str] = []
    problems: list[str] = []

    def is_local(address: str) -> bool:
        url = urlsplit(address)
        return url.scheme in ("http", "https", "ws", "wss") and (url.hostname, url.port) == allowed

    def only_local(route):
        if is_local(route.request.url):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    profile = tmp_path_factory.mktemp("chromium_profile")
    with sync_api.sync_playwright() as pw:
        # A persistent context on a fresh folder = Chromium's --user-data-dir, as Playwright wants it passed.
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000}, service_workers="block")
        try:
            context.route("**/*", only_local)
            pg = context.pages[0] if context.pages else context.new_page()
            pg.on("pageerror", lambda e: problems.append(f"page error: {e.stack or e}"))
            # Routes do not see websockets; the app's one must go to the same server.
            pg.on("websocket", lambda ws: is_local(ws.url) or problems.append(f"websocket to {ws.url}"))
            pg.goto(server.url, wait_until="domcontentloaded", timeout=120_000)
            pg.wait_for_function("() => window.app && window.app.graph && window.app.canvas && window.LiteGraph "
                                 "&& Object.keys(window.LiteGraph.registered_node_types).length > 0",
                                 timeout=120_000)
            pg.evaluate(CAPTURE_MISSING)
            pg.wait_for_timeout(1000)
            _close_dialogs(pg)  # a fresh profile gets the "Get Started with a Template" browser
            # Errors while the app boots are the frontend's own (the pack ships no web/ extension); e.g. 1.27.10
            # throws in a core setting's onChange on a fresh profile. Report them; the tests judge loading only.
            if problems:
                print(f"\nerrors while the frontend started (not counted): {problems}")
                problems.clear()
            pg.blocked, pg.problems = blocked, problems
            yield pg
        finally:
            context.close()
    if blocked:
        print(f"\nrequests to other hosts aborted: {sorted(set(blocked))}")


def test_frontend_versions(server, page):
    stats = server.get("/system_stats")["system"]
    frontend = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ ?? null")
    print(f"\nComfyUI {stats.get('comfyui_version')}, frontend {frontend}, "
          f"browser {page.evaluate('navigator.userAgent')}")
    info = server.get("/object_info")
    registered = set(page.evaluate("() => Object.keys(window.LiteGraph.registered_node_types)"))
    lingbot = {name for name, d in info.items() if d.get("python_module") == f"custom_nodes.{comfy.PACK_DIR_NAME}"}
    assert lingbot, "the pack's nodes are not in /object_info"
    assert lingbot <= registered, f"pack nodes the frontend did not register: {sorted(lingbot - registered)}"


def _load(page, ui: dict) -> tuple[dict, list[str]]:
    """Load a UI workflow in the app; what the graph holds, and the text of any missing-nodes warning."""
    page.problems.clear()
    got = page.evaluate(LOAD_AND_INSPECT, ui)
    page.wait_for_timeout(500)  # let a warning dialog, if any, mount
    dialogs = [t[:500] for t in page.locator(".p-dialog").all_inner_texts()]
    # The missing-nodes warning ("Some Nodes Are Missing", a .comfy-missing-nodes list). A "Missing Models"
    # dialog is expected: the workflows embed download links for files the temp base does not hold.
    warnings = [t for t in dialogs if "nodes are missing" in t.lower()]
    warnings += page.locator(".comfy-missing-nodes").all_inner_texts()
    if dialogs:
        print(f"\ndialogs shown: {[t.splitlines()[0] for t in dialogs if t]}")
    _close_dialogs(page)  # so the next workflow starts clean and the screenshot shows the graph
    return got, warnings


def test_a_missing_node_is_caught(page):
    """The checks below can fail: an unknown node type shows up in each of them."""
    ui = json.loads((comfy.REPO / "example_workflows" / f"{SCREENSHOT_OF}.json").read_text())
    ui["nodes"][0]["type"] = "LingBotNoSuchNode"
    got, warnings = _load(page, ui)
    assert got["missing"] == ["LingBotNoSuchNode"]
    assert got["unregistered"] == ["LingBotNoSuchNode"]
    assert warnings and "LingBotNoSuchNode" in " ".join(warnings)


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_example_workflow_loads_in_frontend(page, path, tmp_path):
    ui = json.loads(path.read_text())
    got, missing_nodes_dialogs = _load(page, ui)

    assert got["missing"] == [], f"{path.name}: the frontend reported missing node types {got['missing']}"
    assert got["unregistered"] == [], f"{path.name}: node types not registered in LiteGraph: {got['unregistered']}"
    assert not missing_nodes_dialogs, f"{path.name}: a missing-nodes dialog appeared: {missing_nodes_dialogs}"
    assert got["count"] == len(ui["nodes"]), f"{path.name}: {got['count']} nodes in the graph, {len(ui['nodes'])} in the file"
    assert sorted(got["types"]) == sorted(n["type"] for n in ui["nodes"])
    assert got["links"] == len(ui["links"]), f"{path.name}: {got['links']} links in the graph, {len(ui['links'])} in the file"
    assert got["hasErrors"] == [], f"{path.name}: nodes flagged with errors: {got['hasErrors']}"
    assert not page.problems, "\n".join(page.problems)

    if path.stem == SCREENSHOT_OF:
        out_dir = Path(os.environ.get("LINGBOT_FRONTEND_SCREENSHOT_DIR", tmp_path))
        out_dir.mkdir(parents=True, exist_ok=True)
        shot = out_dir / f"{path.stem}_frontend.png"
        page.wait_for_timeout(1000)
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
        print(f"\nscreenshot: {shot}")
