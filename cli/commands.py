"""Registry of CLI sub-commands. Each module adds its parser with `add_parser(sub)`."""


def register(sub) -> None:
    from . import smoke

    smoke.add_parser(sub)
