"""The live player through a real headless Chromium (Debian's `chromium` + Playwright's Python client, both
installed by .ci/run; no downloaded browser): keys held and tapped in the page steer the real World session on the
tiny demo checkpoint, and the played clip equals the batch run of the recorded keys frame for frame; with a tiny
decoder a chunk's preview is shown marked, then its real frames, and the page times both."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pytest

from tests.conftest import load_sibling

pytestmark = pytest.mark.slow


support = load_sibling("test_player_support")
WAIT_MS = 300_000  # every wait ends on a condition in the page; this only bounds a hung run
P = "window.lingbotPlayer"


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (see .ci/run)")
    exe = support.chromium_path()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return support.shared_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def server(cache, tmp_path_factory):
    srv = support.PlayServer(cache, tmp_path_factory.mktemp("player_browser") / "out")
    yield srv
    srv.stop()


def _page(browser, url: Optional[str]):
    """A new page with its script errors collected, at `url` (None: not loaded yet)."""
    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if url is not None:
        page.goto(url)
    return page, errors


def _ends(page) -> int:
    return page.evaluate(f"{P}.chunkEnds.length")


def _wait_ends(page, n: int) -> None:
    page.wait_for_function(f"{P}.chunkEnds.length >= {n}")


def test_keys_in_the_page_steer_the_session_and_the_clip_equals_the_batch_run(browser, server, cache, tmp_path):
    page, errors = _page(browser, server.url_for("/"))
    page.wait_for_function(f"{P}.state && {P}.state.started && {P}.state.chunks === 0")
    assert page.inner_text("#pause") == "Play"  # nothing is made before the player presses Play
    # hold W from before Play: the first two chunks are sampled entirely while it is held
    page.keyboard.down("w")
    page.click("#pause")
    _wait_ends(page, 2)
    assert page.evaluate(f"{P}.shown") > 0
    page.keyboard.up("w")
    # hold J: the chunk asked for after the next one is sampled entirely while J is held
    page.keyboard.down("j")
    n0 = _ends(page)
    _wait_ends(page, n0 + 3)
    page.keyboard.up("j")
    # a tap while paused is latched into the next sampled frame; an unknown key gets a visible note
    page.click("#pause")
    page.wait_for_function(f"{P}.paused && !{P}.inFlight")
    tapped_from = len(page.evaluate(f"{P}.sent"))
    page.keyboard.press("a")
    page.keyboard.press("x")
    assert "not a control key" in page.inner_text("#note")
    page.click("#pause")
    page.wait_for_function(f"{P}.sent.length >= {tapped_from + 1}")
    _wait_ends(page, page.evaluate(f"{P}.sent.length"))
    page.click("#pause")
    page.wait_for_function(f"{P}.paused && !{P}.inFlight")

    sent = page.evaluate(f"{P}.sent")
    state = page.evaluate(f"{P}.state")
    assert sent[0] == "w-8" and sent[1] == "w-12", sent
    assert sent[n0 + 2] == "j-12", (n0, sent)
    from lingbot_world.wan.control.actions import KEYS, KeyTimeline

    assert KeyTimeline.from_string(sent[tapped_from]).pressed[:, KEYS.index("a")].any(), sent[tapped_from]

    recorded = KeyTimeline.from_string(state["action_string"])
    pressed = KeyTimeline.from_string(",".join(sent))
    assert np.array_equal(recorded.pressed, pressed.pressed)  # the server played exactly the keys the page sent
    assert state["chunks"] == len(sent) and page.inner_text("#actions") == state["action_string"]
    assert page.inner_text("#s-chunk") == str(state["chunks"]) and page.evaluate(
        "document.getElementById('minimap').src").startswith("data:image/png")

    # the page reported its own clock for every chunk it showed (requests are pipelined: the chunk asked for while
    # the last one played may have arrived after the pause, unshown); each duration contains the server's part
    shown = page.evaluate(f"{P}.shownChunk")
    assert 1 <= shown <= state["chunks"], (shown, state["chunks"])
    page.wait_for_function(f"Object.values({P}.timings).filter(r => r.request_to_screen_s !== null && "
                           f"r.server_total_s !== null).length >= {shown}")
    rows = {int(c): r for c, r in page.evaluate(f"{P}.timings").items()}
    assert sorted(rows) == list(range(1, state["chunks"] + 1))
    on_screen = [r for r in rows.values() if r["request_to_screen_s"] is not None]
    assert sorted(r["chunk"] for r in on_screen) == list(range(1, shown + 1)), rows
    for r in on_screen:
        assert r["server_first_frame_s"] <= r["request_to_arrival_s"] <= r["request_to_screen_s"], r
    steered = [r for r in rows.values() if r["key_to_screen_s"] is not None]
    assert steered and all(r["key_to_screen_s"] > 0 for r in steered)  # W released, J pressed, A tapped
    assert page.evaluate(f"{P}.timingSummary.chunks") == state["chunks"]
    assert page.inner_text("#s-key-median").endswith("changes)")

    page.click("#save")
    page.wait_for_function(f"{P}.saved")
    video = next(p for p in page.evaluate(f"{P}.saved") if p.endswith(".mp4"))
    assert not errors and not page.evaluate(f"{P}.errors")
    page.close()

    import imageio.v3 as iio

    batch = tmp_path / "batch.mp4"
    argv = ["generate", "--demo", "--model", "fast", "--rule", "continuable",
           "--actions", state["action_string"], "--window", "21", "--sink", "3", "--seed", "42",
           "--cache-dir", str(cache / "text"), "--out", str(batch), "--quiet"]
    support.run_batch(argv, cache)
    played, expected = iio.imread(video), iio.imread(batch)
    assert played.shape == expected.shape and played.shape[0] == state["frames"]
    differ = [i for i in range(played.shape[0]) if not np.array_equal(played[i], expected[i])]
    assert not differ, f"played frames {differ} differ from the batch run's"


def test_the_page_asks_while_a_chunk_plays_and_keeps_every_tap(browser, server):
    """The page's request policy (player.js `takeKeys`, `asksNow`), on its own inputs: no clock involved."""
    page, errors = _page(browser, server.url_for("/"))
    page.wait_for_function(f"{P}.policy")

    def take(samples, need, held):
        return page.evaluate(f"([s, n, h]) => {P}.policy.takeKeys(s, n, h)", [samples, need, held])

    # the samples since the last request, then the keys held now for the frames not sampled yet
    assert take(["w", "w"], 4, "wj") == ["w", "w", "wj", "wj"]
    assert take([], 8, "w") == ["w"] * 8 and take(["w"], 0, "w") == []
    # more samples than the chunk takes (a server slower than playback): the latest ones, the older folded into
    # the first kept, so a key tapped for one sample still steers the chunk
    assert take(["a", "", "w", "w", "j"], 3, "") == ["wa", "w", "j"]
    assert take(["w"] * 15, 12, "") == ["w"] * 12

    def asks(queued, lead):
        return page.evaluate(f"([q, l]) => {P}.policy.asksNow(q, l)", [queued, lead])

    # a server slower than playback is asked at once, with a whole chunk still to play (12 frames: 0.75 s)
    assert asks(12, 0.84) and asks(12, 10.0)
    # a faster one only once the frames queued play out within its latency
    assert not asks(12, 0.3) and asks(4, 0.3)
    assert not errors
    page.close()


def test_second_tab_shows_in_use_and_a_wrong_token_gets_403(browser, server):
    first, _ = _page(browser, server.url_for("/"))
    first.wait_for_function(f"{P}.connected")
    second, _ = _page(browser, server.url_for("/"))
    second.wait_for_function(f"{P}.busy")
    assert second.is_visible("#busy") and not second.is_visible("#app")
    assert "in use" in second.inner_text("#busy")
    second.close()
    first.close()
    page = browser.new_page()
    response = page.goto(server.url_for("/", "not-the-token"))
    assert response.status == 403
    page.close()


def test_refusals_show_in_the_page_and_old_notes_go(browser, server):
    page, errors = _page(browser, server.url_for("/"))
    page.wait_for_function(f"{P}.connected")
    page.evaluate(f"{P}.noteMs = 300; {P}.errorMs = 300")
    huge = {"name": "huge.png", "mimeType": "image/png", "buffer": support.png_header(16000, 11000)}
    page.set_input_files("#image-upload", files=[huge])
    page.wait_for_function(f"{P}.errors.some(e => e.includes('megapixels'))")
    shown = page.evaluate(f"{P}.errors[{P}.errors.length - 1]")
    assert shown.startswith("upload refused (413): upload: the picture is 16000x11000 (176 megapixels)"), shown
    page.wait_for_function("document.getElementById('note').textContent === ''")  # gone after a while
    page.set_input_files("#image-upload", files=[{"name": "x.png", "mimeType": "image/png", "buffer": b"not a png"}])
    page.wait_for_function(f"{P}.errors.some(e => e.startsWith('upload refused (400): upload: not a PNG'))")
    page.wait_for_function("document.getElementById('note').textContent === ''")
    page.keyboard.press("x")  # a note, not an error: it goes as well
    assert "not a control key" in page.inner_text("#note")
    page.wait_for_function("document.getElementById('note').textContent === ''")
    assert not errors
    page.close()


def test_show_command_has_no_bar_and_a_restart_clears_the_numbers(browser, server):
    page, errors = _page(browser, server.url_for("/"))
    page.wait_for_function(f"{P}.state && {P}.state.started")
    page.click("#pause")
    _wait_ends(page, 1)
    page.click("#pause")
    page.wait_for_function(f"{P}.paused && !{P}.inFlight")
    page.wait_for_function("document.getElementById('s-chunk-time').textContent !== '-'")
    minimap = page.evaluate("(() => { const m = document.getElementById('minimap'); return [m.naturalWidth, "
                            "m.naturalHeight, m.clientWidth, m.clientHeight]; })()")
    assert minimap[0] == 320 and abs(minimap[1] / minimap[0] - minimap[3] / minimap[2]) < 0.02, minimap
    page.click("#render-cmd")
    page.wait_for_function(f"{P}.render && {P}.render.status === 'command'")
    assert page.is_hidden("#render-progress") and "--prompt=" in page.inner_text("#render-command")
    page.click("#start")  # restart: a new video
    page.wait_for_function(f"{P}.state.chunks === 0 && {P}.running")
    for cell in ("s-chunk-time", "s-first", "s-key", "s-key-median"):
        assert page.inner_text(f"#{cell}") == "-", cell
    assert page.evaluate(f"{P}.timingSummary") is None and page.evaluate(f"{P}.chunkEnds.length") == 0
    assert not errors and not page.evaluate(f"{P}.errors")
    page.close()


def test_a_slow_page_records_keys_by_the_videos_frames(browser, server):
    """The page's clock is Playwright's, paused (its time moves only when told): a page that manages 8 ticks a
    second still takes 16 key samples a second, so a key held 2 s is 32 frames of keys (it was 16)."""
    import time

    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)
    page.clock.install()
    page.goto(server.url_for("/"))

    def until(condition: str) -> None:  # the socket is real
        deadline = time.monotonic() + WAIT_MS / 1000
        while not page.evaluate(condition):
            assert time.monotonic() < deadline, condition
            page.clock.run_for(100)

    until(f"{P}.state && {P}.state.started && {P}.connected")
    # An installed clock also runs with the real one: the samples counted grew with the time the test's own calls
    # took (up to 40 in 2 s of the page's time). Paused, it moves by run_for alone.
    page.clock.pause_at(page.evaluate("Date.now()") / 1000 + 1)
    page.evaluate(f"{P}.tickEvery = 125")
    # Nor does a request leave while the samples are counted: a request takes one sample ahead of its frame (the
    # keys of its moment), and one sent when the real socket's answer landed just before the first read moved a
    # sample out of the count (31). Paused, this page has sent none; one marked in flight keeps it from sending.
    page.evaluate(f"{P}.inFlight = true")
    page.click("#pause")
    until(f"!{P}.paused")
    page.keyboard.down("w")
    page.clock.run_for(125)
    before = page.evaluate(f"{P}.sampledFrames")
    page.clock.run_for(2000)
    taken = page.evaluate(f"{P}.sampledFrames") - before
    page.keyboard.up("w")
    assert taken == 32, taken  # 16 ticks of the page, 2 video frames each
    page.close()


def test_real_frames_take_their_previews_place_and_the_clock_reports_both(browser, server):
    """The page's frame placement and clock (screen.js `placeReal`, `screenReport`) on their own inputs."""
    page, errors = _page(browser, server.url_for("/"))
    page.wait_for_function(f"{P}.policy")
    place = f"""([queue, onScreen, item]) => {{
        const q = queue.map((f) => ({{ ...f }}));
        return [{P}.policy.placeReal(q, onScreen, item), q];
    }}"""

    def prev(frame):
        return {"chunk": 2, "frame": frame, "preview": True}

    def real(frame):
        return {"chunk": 2, "frame": frame, "preview": False}

    # its preview still queued: the real frame takes its place (the order stays the video's)
    assert page.evaluate(place, [[prev(9), prev(10)], None, real(10)]) == ["replaced", [prev(9), real(10)]]
    # its preview on screen: drawn at once; one already played: dropped (the video does not go back)
    assert page.evaluate(place, [[prev(11)], prev(10), real(10)]) == ["redraw", [prev(11)]]
    assert page.evaluate(place, [[prev(11)], prev(10), real(9)]) == ["past", [prev(11)]]
    # no preview (a VAE, --no-preview): queued as ever
    assert page.evaluate(place, [[real(9)], real(9) | {"chunk": 1}, real(10)]) == ["queued", [real(9), real(10)]]

    report = f"([requests, item, now]) => [{P}.policy.screenReport(requests, item, now, 16), requests]"
    asked = {"2": {"sentAt": 1000, "arrivedAt": 1900, "previewAt": 1300, "keyChange": 500}}
    shown, left = page.evaluate(report, [asked, prev(9), 1400])
    assert shown == {"op": "timing", "chunk": 2, "request_to_preview_s": 0.4, "key_to_preview_s": 0.9}
    assert page.evaluate(report, [left, prev(10), 1450])[0] is None  # once per chunk
    shown, left = page.evaluate(report, [left, real(9), 2000])
    assert shown == {"op": "timing", "chunk": 2, "request_to_arrival_s": 0.9, "request_to_screen_s": 1.0,
                     "key_to_screen_s": 1.5, "fps": 16} and left == {}
    # the real frames overtook a preview that never reached the screen: they were the chunk's first picture
    shown, _ = page.evaluate(report, [asked, real(9), 2000])
    assert shown["key_to_preview_s"] == shown["key_to_screen_s"] == 1.5
    assert not errors
    page.close()


@pytest.fixture(scope="module")
def preview_server(cache, tmp_path_factory):
    from lingbot_world.loaders.demo_checkpoint import write_random_tiny_vae

    folder = tmp_path_factory.mktemp("player_browser_preview")
    tiny = write_random_tiny_vae(folder / "taew2_1.safetensors")
    srv = support.PlayServer(cache, folder / "out", "--tiny-vae", str(tiny))
    srv.tiny_vae = tiny
    yield srv
    srv.stop()


class _Gate:
    """The page's WebSocket through Playwright: the server's messages pass, but from the first real frame of chunk
    `at` on they are held, in order, until `release()`. The page has the chunk's preview and nothing of its real
    frames for as long as the test looks, however fast the server is."""

    def __init__(self, page):
        self.at, self.closed, self.held, self.route = None, False, [], None
        page.route_web_socket(lambda url: "/ws?" in url, self._connect)

    def _connect(self, ws) -> None:
        self.route = ws
        ws.connect_to_server().on_message(self._from_server)

    def _from_server(self, message) -> None:
        from lingbot_world.player.frames import is_preview, read_frame_message

        if self.at is not None and isinstance(message, bytes) and not is_preview(message) \
                and read_frame_message(message)[0] == self.at:
            self.closed = True
        if self.closed:
            self.held.append(message)
        else:
            self.route.send(message)

    def release(self) -> None:
        self.at, self.closed = None, False
        for message in self.held:
            self.route.send(message)
        self.held.clear()


def test_a_chunks_preview_is_shown_marked_then_its_real_frames(browser, preview_server, cache, tmp_path):
    page, errors = _page(browser, None)
    gate = _Gate(page)
    page.goto(preview_server.url_for("/"))
    page.wait_for_function(f"{P}.state && {P}.state.started && {P}.state.chunks === 0")
    page.click("#pause")  # the first chunk, without keys
    _wait_ends(page, 1)
    page.click("#pause")
    page.wait_for_function(f"{P}.paused && !{P}.inFlight")
    assert page.evaluate(f"{P}.previewFrames") >= 9  # the first chunk's preview came too
    n = page.evaluate(f"{P}.state.chunks") + 1
    gate.at = n
    page.keyboard.down("w")  # a key change, sampled at Play: chunk n is steered by it
    page.click("#pause")
    # the preview of chunk n is on screen, marked, while its real frames are still held back
    page.wait_for_function(f"{P}.onScreen && {P}.onScreen.preview && {P}.onScreen.chunk === {n}")
    assert page.is_visible("#preview-badge") and page.inner_text("#preview-badge") == "preview"
    page.click("#pause")  # paused, nothing more is asked for: the real frames of chunk n are the last to come
    page.keyboard.up("w")
    gate.release()
    page.wait_for_function(f"{P}.onScreen.chunk === {n} && !{P}.onScreen.preview && !{P}.inFlight")
    assert page.is_hidden("#preview-badge")  # the real frame replaced the preview on screen
    page.wait_for_function(f"{P}.timings[{n}] && {P}.timings[{n}].key_to_preview_s !== null && "
                           f"{P}.timings[{n}].key_to_screen_s !== null && {P}.timings[{n}].server_total_s !== null")
    row = page.evaluate(f"{P}.timings[{n}]")
    assert 0 < row["key_to_preview_s"] < row["key_to_screen_s"], row
    assert row["request_to_preview_s"] < row["request_to_screen_s"], row
    assert row["server_preview_s"] <= row["server_first_frame_s"] <= row["request_to_arrival_s"], row
    assert page.evaluate(f"{P}.timingSummary.key_to_preview_s.n") >= 1
    assert "median" in page.inner_text("#s-key-preview")

    page.click("#save")  # the clip holds the real frames only: the batch run of its keys with the tiny decoder
    page.wait_for_function(f"{P}.saved")
    video = next(p for p in page.evaluate(f"{P}.saved") if p.endswith(".mp4"))
    actions = page.evaluate(f"{P}.state.action_string")
    assert not errors and not page.evaluate(f"{P}.errors")
    page.close()

    import imageio.v3 as iio

    batch = tmp_path / "batch.mp4"
    support.run_batch(["generate", "--demo", "--model", "fast", "--rule", "continuable", "--actions", actions,
                       "--window", "21", "--sink", "3", "--seed", "42", "--tiny-vae", str(preview_server.tiny_vae),
                       "--cache-dir", str(cache / "text"), "--out", str(batch), "--quiet"], cache)
    played, expected = iio.imread(video), iio.imread(batch)
    assert played.shape == expected.shape and np.array_equal(played, expected)

