"""Registry of CLI sub-commands. Each module adds its parser with `add_parser(sub)`."""
import importlib

COMMANDS = ("generate", "check_expert", "convert_expert", "smoke")


def register(sub) -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as e:  # a sub-command whose module is not there yet
            if e.name and e.name.endswith(name):
                continue
            raise
        mod.add_parser(sub)
