"""pyproject.toml ships what a clone has: every Python package folder and every data folder the pack reads at run
time, so a wheel works like the clone and setuptools has nothing to warn about (it warns for an importable folder
missing from `packages`)."""
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_SHIPPED = {"tests", "docs", "bench/results"}  # for a clone's readers: the tests, the guide, measurements


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]


def _dotted(folder: Path) -> str:
    return ".".join(("lingbot_world", *folder.relative_to(REPO).parts))


def _shipped_candidates() -> set[str]:
    """Every folder below the root whose name Python could import (identifier names), except hidden ones."""
    names = set()
    for folder in REPO.rglob("*"):
        rel = folder.relative_to(REPO).parts
        if (not folder.is_dir() or any("/".join(rel[:i + 1]) in NOT_SHIPPED for i in range(len(rel)))
                or any(p.startswith((".", "_")) for p in rel)
                or not all(p.isidentifier() for p in rel) or not any(folder.iterdir())):
            continue
        names.add(_dotted(folder))
    return names


def test_every_importable_folder_is_a_listed_package():
    listed = set(_setuptools()["packages"])
    missing = _shipped_candidates() - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"
    gone = {p for p in listed - {"lingbot_world"} if not (REPO / Path(*p.split(".")[1:])).is_dir()}
    assert not gone, f"listed packages with no folder: {sorted(gone)}"


def test_data_folders_declare_their_files():
    setuptools = _setuptools()
    listed, data = set(setuptools["packages"]), setuptools["package-data"]
    for package in ("lingbot_world.assets", "lingbot_world.assets.examples", "lingbot_world.example_workflows",
                    "lingbot_world.locales.en", "lingbot_world.web", "lingbot_world.player.static"):
        folder = REPO / Path(*package.split(".")[1:])
        own = [f for f in folder.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".py"
               and not any(_dotted(d) in listed for d in f.parents if folder in d.parents)]  # not a subpackage's
        shipped = {f for pattern in data.get(package, []) for f in folder.glob(pattern)}
        unmatched = sorted(str(f.relative_to(folder)) for f in own if f not in shipped)
        assert not unmatched, f"{package}: files no package-data pattern ships: {unmatched}"


def test_license_is_an_spdx_string():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"


def test_the_readme_test_command_is_what_ci_runs():
    import re

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shown = re.search(r"CI runs exactly this.*?```bash\n(?P<cmd>[^\n]+)\n```", readme, re.S).group("cmd").strip()
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert ci[-1] == shown == "python -m pytest -n 2"
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(dep.startswith("pytest-xdist") for dep in extra)  # -n needs it
