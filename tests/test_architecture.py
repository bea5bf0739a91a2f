"""The architecture rule, checked mechanically (issue 25): "a door parses its input into typed settings and calls
the layer below; argparse namespaces never travel down", and inside cli/ "`args` stops at the CLI's parser".

Each cli/*.py is parsed with `ast`. Outside the allow-list below, no function has a parameter named `args` or
annotated `argparse.Namespace`, and no code reads an attribute of a name `args`. A varargs `*args` (a pass-through
of positional arguments, e.g. cli.Parser.__init__) is not a namespace and is not looked at.
"""
import ast
from pathlib import Path

CLI = Path(__file__).resolve().parent.parent / "cli"

# The module whose job is reading a namespace into a typed request.
REQUEST_MODULES = {"requests.py"}  # FlagRequest.from_args: the requests of generate, play and compare
# Functions that receive the namespace from argparse and turn it into a request (or, for the one-call commands,
# read their few flags) at once.
ENTRY_POINTS = {
    ("__init__.py", "main"),  # parses, dispatches to args.func, reads --debug
    ("generate.py", "run"),
    ("play.py", "run"),
    ("compare.py", "run"),
    ("check_expert.py", "run"),
    ("convert.py", "run"),
    ("smoke.py", "run"),
}


def _is_namespace(annotation) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation).strip("'\"")
    return text in ("argparse.Namespace", "Namespace")


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def visit(node, allowed: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            name = getattr(node, "name", "<lambda>")
            allowed = allowed or (path.name, name) in ENTRY_POINTS
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs:
                if not allowed and (arg.arg == "args" or _is_namespace(arg.annotation)):
                    found.append(f"{path.name}:{node.lineno} {name}() takes {arg.arg!r}")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args"
              and not allowed):
            found.append(f"{path.name}:{node.lineno} reads args.{node.attr}")
        for child in ast.iter_child_nodes(node):
            visit(child, allowed)

    visit(tree, path.name in REQUEST_MODULES)
    return found


def test_args_stop_at_the_parser():
    files = sorted(CLI.glob("*.py"))
    assert len(files) > 10
    bad = [line for f in files for line in _violations(f)]
    assert not bad, "the argparse namespace travels below the parser:\n" + "\n".join(bad)


def test_the_allow_list_names_what_exists():
    """A renamed entry point or request module must not leave a stale (and silently wider) allow-list."""
    for module in REQUEST_MODULES:
        assert (CLI / module).is_file(), module
    for module, function in ENTRY_POINTS:
        tree = ast.parse((CLI / module).read_text(encoding="utf-8"))
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"{module}: {function}"


def test_the_check_sees_a_namespace_passed_down(tmp_path):
    """The checker itself: a helper taking `args`, one annotated argparse.Namespace and a read of args.x are found;
    an entry point and *args are not."""
    sample = tmp_path / "generate.py"
    sample.write_text(
        "import argparse\n"
        "def run(args):\n    return helper(args.x)\n"
        "def helper(args):\n    return 1\n"
        "def other(ns: argparse.Namespace, *args):\n    return ns\n"
        "def reads(request):\n    return args.y\n", encoding="utf-8")
    found = _violations(sample)
    assert [line.split(" ", 1)[1] for line in found] == ["helper() takes 'args'", "other() takes 'ns'",
                                                          "reads args.y"]
