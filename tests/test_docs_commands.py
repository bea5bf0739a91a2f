"""The README and the user guide stay true: every command they mark as runnable runs, and every relative link
points at a file (and heading) that exists.

Marking a command, in the Markdown source, on the line before a ```bash block:
- `<!-- runnable -->`: the block runs as written, in a scratch folder that mirrors a clone (its top-level entries
  linked in, so `assets/examples/...` resolves and outputs land in the scratch folder).
- `<!-- runnable: demo checkpoint -->`: the same, demo-sized: a model folder written as `/models/NAME` becomes the
  tiny random-weight demo checkpoint (the Act one when NAME mentions "act"), and every `lingbot-world generate`
  gets `--device cpu`, a tiny `--size` and, for the base models, 2 steps.
- `<!-- runnable: exits N -->`: as written, and the block must end with exit code N.

`lingbot-world` and `python` in a block are this interpreter with the code under test; caches (demo checkpoint,
prompts, compiled kernels) live in one temporary folder shared by the blocks.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]

DEMO_SIZE = "32*48"  # the VAE dominates a tiny run; this keeps 81 frames at a few CPU-seconds
DEMO_STEPS = "2"
BLOCK_TIMEOUT_S = 240

_MARKER = re.compile(r"<!--\s*runnable(?::\s*(?P<mode>[^>]*?))?\s*-->\s*\n(?P<fence>```[^\n]*)\n(?P<body>.*?)\n```",
                     re.S)
_MODEL_PATH = re.compile(r"/models/(?P<name>[\w.-]+)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    mode: str
    body: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def runnable_blocks() -> list[Block]:
    blocks = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for m in _MARKER.finditer(text):
            blocks.append(Block(page, text.count("\n", 0, m.start()) + 1, (m.group("mode") or "").strip(),
                                m.group("body")))
    return blocks


BLOCKS = runnable_blocks()


def test_every_marker_opens_a_bash_block():
    """A marker that does not sit right above a ```bash block (or a mode the runner does not know) would make a
    command silently unchecked."""
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        markers = len(re.findall(r"<!--\s*runnable", text))
        found = [b for b in BLOCKS if b.page == page]
        assert markers == len(found), f"{page.name}: {markers} runnable markers, {len(found)} followed by a block"
        for m in _MARKER.finditer(text):
            assert m.group("fence").strip() == "```bash", f"{page.name}: a runnable block must be ```bash"
    for block in BLOCKS:
        assert block.mode in ("", "demo checkpoint") or re.fullmatch(r"exits \d+", block.mode), \
            f"{block.name}: unknown runnable mode {block.mode!r}"


def test_the_guide_has_runnable_commands():
    pages = {b.page.name for b in BLOCKS}
    assert {"README.md", "fast.md", "keys-and-act.md", "camera.md", "troubleshooting.md"} <= pages, pages


# --- running the blocks ----------------------------------------------------------------------------------------

def _logical_lines(body: str) -> list[str]:
    """Shell lines with their backslash continuations joined."""
    lines, current = [], ""
    for raw in body.splitlines():
        if raw.endswith("\\"):
            current += raw[:-1] + " "
        else:
            lines.append(current + raw)
            current = ""
    if current:
        lines.append(current)
    return lines


def _split_comment(line: str) -> tuple[str, str]:
    """(command, trailing comment): a `#` that starts a word outside quotes begins the comment."""
    quote: Optional[str] = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def demo_sized(body: str, cam_dir: Path, act_dir: Path) -> str:
    """The block with its model folders pointed at the demo checkpoints and its generate runs made tiny."""
    out = []
    for line in _logical_lines(body):
        command, _comment = _split_comment(line)
        command = _MODEL_PATH.sub(lambda m: str(act_dir if "act" in m.group("name") else cam_dir), command)
        if re.match(r"\s*lingbot-world\s+generate\b", command):
            extra = ["--device", "cpu"]
            if "--continue-from" not in command:  # a continuation takes its size from the state
                extra += ["--size", f"'{DEMO_SIZE}'"]
            if "--model fast" not in command:
                extra += ["--steps", DEMO_STEPS]
            command = f"{command} {' '.join(extra)}"
        out.append(command)
    return "\n".join(out)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The two commands the blocks call and the caches they share."""
    root = tmp_path_factory.mktemp("docs")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, argv in (("lingbot-world", f'"{sys.executable}" -m lingbot_world'), ("python", f'"{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LINGBOT_WORLD_CACHE"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", XDG_CACHE_HOME=str(root / "cache"))
    return env, root


@pytest.fixture(scope="module")
def demo_models(sandbox):
    """The tiny demo checkpoints (Cam with the Fast model, and Act), built once for the blocks that need them."""
    from lingbot_world.loaders.demo_checkpoint import build_demo_checkpoint
    from lingbot_world.world import WorldFiles

    _env, root = sandbox
    built = {}

    def get() -> tuple[Path, Path]:
        if not built:
            built["cam"] = WorldFiles.demo(root / "models" / "cam").root  # the Cam experts with v1 Fast inside
            built["act"] = build_demo_checkpoint(root / "models" / "act", control="act").root
        return built["cam"], built["act"]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_runnable_block(block: Block, sandbox, demo_models, tmp_path):
    env, _root = sandbox
    script = block.body
    if block.mode == "demo checkpoint":
        script = demo_sized(script, *demo_models())
    expected = int(block.mode.split()[1]) if block.mode.startswith("exits") else 0
    work = tmp_path / "work"
    work.mkdir()
    for entry in REPO.iterdir():  # a clone's top level, so `assets/examples/...` resolves; outputs stay here
        if not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)
    assert proc.returncode == expected, (
        f"{block.name}: exit {proc.returncode}, expected {expected}\n--- ran:\n{script}\n"
        f"--- stdout:\n{proc.stdout[-3000:]}\n--- stderr:\n{proc.stderr[-3000:]}")


def test_demo_sizing_rewrites_only_what_it_must(tmp_path):
    body = ('lingbot-world generate --ckpt-dir /models/lingbot-world-base-cam-nf4 \\\n'
            '    --prompt "a # b" --out x.mp4   # comment\n'
            'lingbot-world generate --model fast --continue-from s.state --out y.mp4\n'
            'lingbot-world check-expert /models/lingbot-world-base-act/high_noise_model --device cpu')
    lines = demo_sized(body, tmp_path / "cam", tmp_path / "act").splitlines()
    assert lines[0] == (f'lingbot-world generate --ckpt-dir {tmp_path / "cam"}      --prompt "a # b" --out x.mp4 '
                        f"--device cpu --size '{DEMO_SIZE}' --steps {DEMO_STEPS}")
    assert lines[1] == "lingbot-world generate --model fast --continue-from s.state --out y.mp4 --device cpu"
    assert lines[2] == f"lingbot-world check-expert {tmp_path / 'act'}/high_noise_model --device cpu"


# --- every documented command parses ------------------------------------------------------------------------

_BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
_REPO_PATH = re.compile(r"(?<![\w/.$-])((?:assets|examples|docs|tests|example_workflows|bench|tools)/[\w./-]*\w)")
_CLI = re.compile(r"(?:^|\s)(?:lingbot-world|-m lingbot_world(?:\.cli)?)\s+(.*)$")


def documented_commands() -> list[tuple[str, str]]:
    """(page:line, command) for every shell line of every ```bash block, marked runnable or not."""
    found = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for m in _BASH_BLOCK.finditer(text):
            line_no = text.count("\n", 0, m.start()) + 2
            for line in _logical_lines(m.group(1)):
                command, _ = _split_comment(line)
                if command.strip():
                    found.append((f"{page.relative_to(REPO)}:{line_no}", command))
    return found


def command_problems(where: str, command: str, parser) -> list[str]:
    """What is stale in one documented shell line: a path into the clone that does not exist, or (for a
    `lingbot-world ...` line without placeholders) a flag, value or choice the CLI's parser refuses."""
    problems = []
    for path in _REPO_PATH.findall(command):
        if not re.search(r"--out\s+" + re.escape(path), command) and not (REPO / path).exists():
            problems.append(f"{where}: {path} does not exist")
    m = _CLI.search(command)
    if not m or "..." in command or "\u2026" in command:  # not the CLI, or a placeholder to fill in
        return problems
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(shlex.split(m.group(1)))
    except SystemExit as stop:
        if stop.code:
            problems.append(f"{where}: {(err.getvalue().strip().splitlines() or ['?'])[-1]}")
    return problems


@pytest.fixture(scope="module")
def cli_parser():
    from lingbot_world.cli import build_parser

    return build_parser()


def test_every_documented_command_line_parses(cli_parser):
    """The commands no block runs (real model folders, GPUs, torchrun) still name real flags, choices and files."""
    problems = [p for where, command in documented_commands() for p in command_problems(where, command, cli_parser)]
    assert not problems, "\n".join(problems)


def test_the_parse_check_catches_stale_commands(cli_parser):
    assert command_problems("x", "lingbot-world generate --ckpt-dir /m --camera-mode fast", cli_parser)
    assert command_problems("x", "lingbot-world generate --ckpt-dir /m --memory-mode tiny", cli_parser)
    assert command_problems("x", "lingbot-world generate --image examples/03/image.jpg", cli_parser)  # not in a clone
    assert command_problems("x", "lingbot-world generate --image assets/examples/04/image.jpg", cli_parser)
    assert command_problems("x", "lingbot-world generate --image assets/examples/03/image.jpg", cli_parser) == []
    assert command_problems("x", "torchrun --nproc_per_node=2 -m lingbot_world.cli generate --parallel cfx",
                            cli_parser)
    assert command_problems("x", "lingbot-world generate --ckpt-dir /m --out assets/new.mp4", cli_parser) == []


# --- links -----------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors: lower case, inline markup and punctuation dropped, spaces to hyphens, repeats numbered."""
    anchors, seen = set(), {}
    for m in _HEADING.finditer(_FENCE.sub("", text)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2)).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_heading_anchors_follow_github():
    assert heading_anchors("# Several GPUs (2 × H200)\n## The K/V cache: where it lives\n## A\n## A\n") == {
        "several-gpus-2--h200", "the-kv-cache-where-it-lives", "a", "a-1"}


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(REPO)) for p in DOCS])
def test_relative_links_resolve(page: Path):
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(_prose(text)):
        if re.match(r"[a-z]+:", target):  # http(s), mailto
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{page.relative_to(REPO)}: broken links: " + "; ".join(broken)


def test_readme_is_a_short_product_page():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    history = re.findall(r"\b(?:\w+ session|issue \d+)\b", _prose(text), re.I)
    assert not history, f"the README tells history: {history}"
    guide = {p.name for p in (REPO / "docs").glob("*.md")}
    linked = {Path(t.partition("#")[0]).name for t in _LINK.findall(text) if t.startswith("docs/")}
    assert guide <= linked, f"guide pages the README does not link: {sorted(guide - linked)}"
