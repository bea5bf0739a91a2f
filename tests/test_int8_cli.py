"""`--weights int8` through the doors: `convert-int8`, `generate --model fast` and a played session on a private copy
of the demo (its INT8 copy, torch's int8 GEMM on the CPU) give the same frames; the flag is refused in one line
where it cannot apply (the base model, a card without INT8 GEMMs), and check-expert loads the copy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lingbot_world.cli import main
from lingbot_world.world import TextSettings, WorldFiles, WorldSettings, open_session

from tests.conftest import load_sibling


FP8_CLI = load_sibling("test_fp8_cli")  # its batch run (`_generate`) and demo settings serve every weights mode


def test_int8_weights_play_as_the_batch_run(copy_demo, tmp_path, capsys):
    from lingbot_world.world.demos import demo_ready
    from lingbot_world.world.models import V1_FAST

    root = copy_demo()  # private: its INT8 copy is added here, the session's demo stays as built
    assert not demo_ready(V1_FAST, root, "int8")
    batch = FP8_CLI._generate(root, tmp_path, "int8")  # builds the INT8 copy from the demo's NF4 Fast model
    assert demo_ready(V1_FAST, root, "int8") and not demo_ready(V1_FAST, root, "fp8")
    files = WorldFiles.demo(root, weights="int8")
    fmt, _, notes = files.check("int8")
    assert files.dit.name == "lingbot_world_fast_int8" and fmt.kind == "int8" and notes == []
    assert fmt.quant_meta["source"] == "nf4"  # the demo has only NF4 weights: said in the metadata
    text = TextSettings(device="cpu", cache_dir=tmp_path / "text")
    with open_session(files, WorldSettings(size=FP8_CLI.SIZE, weights="int8", text=text), device="cpu") as s:
        s.start(FP8_CLI.IMAGE, FP8_CLI.PROMPT)
        played = np.concatenate([b.frames for key in FP8_CLI.KEYS for b in s.step(key)])
    assert played.dtype == np.uint8 and played.shape == batch.shape and np.array_equal(played, batch)
    assert not np.array_equal(batch, FP8_CLI._generate(root, tmp_path, "nf4"))

    capsys.readouterr()
    assert main(["check-expert", str(files.dit), "--device", "cpu", "--mode", "int8"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "int8"


def test_convert_int8_cli(copy_demo, tmp_path, capsys):
    root = copy_demo()
    out = tmp_path / "lingbot_world_fast_int8"
    assert main(["convert-int8", str(root / "lingbot_world_fast_bnb_nf4"), str(out), "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ok"] and res["source"] == "nf4" and "INT8" in res["note"] and res["out"] == str(out)
    assert json.loads((out / "quantization_meta.json").read_text())["quant"]["format"] == "lingbot_int8"
    assert main(["convert-int8", str(out), str(tmp_path / "again"), "--device", "cpu"]) == 2  # INT8 already
    assert "holds INT8 weights already" in json.loads(capsys.readouterr().out)["error"]
    assert not (tmp_path / "again").exists()


def test_int8_weights_are_refused_where_they_cannot_run(demo_ckpt, tmp_path, capsys, monkeypatch):
    from lingbot_world.quant import compute

    no_card = "--weights int8 needs an Ampere-or-newer GPU (sm80+); this card is sm75: use --weights nf4"
    demo = ["--demo", "--demo-dir", str(demo_ckpt), "--weights", "int8"]
    generate = ["generate", *demo, "--out", str(tmp_path / "x.mp4")]
    cases = [  # (argv, the one line's text, whether the card check is patched to refuse)
        (generate, "--weights int8 is for the Fast model (add --model fast)", False),
        (generate + ["--model", "fast"], no_card, True),
        (["play", *demo, "--no-browser", "--port", "0", "--out-dir", str(tmp_path / "o")], no_card, True),
    ]
    for argv, says, patched in cases:
        if patched:
            monkeypatch.setattr(compute, "stored_weights_unavailable", lambda kind, device: no_card)
        assert main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (argv, lines)
    assert not (tmp_path / "x.mp4").exists()
    assert not (demo_ckpt / "lingbot_world_fast_int8").exists()  # refused before the demo's INT8 copy is made


def test_the_players_fast_render_keeps_int8():
    from lingbot_world.player.options import RenderSource
    from lingbot_world.player.render_job import render_command

    src = RenderSource(("--demo",), 42, FP8_CLI.SIZE, 21, 3, demo=True, fast_weights="int8")
    cmd = render_command(src, "fast720", "w-8", Path(FP8_CLI.IMAGE), FP8_CLI.PROMPT, Path("out.mp4"))
    assert cmd[cmd.index("--weights") + 1] == "int8"
