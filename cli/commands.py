"""Registry of CLI sub-commands. Each module adds its parser with `add_parser(sub)`."""


def register(sub) -> None:
    from . import check_expert, compare, convert, generate, play, smoke

    for mod in (generate, play, compare, check_expert, convert, smoke):
        mod.add_parser(sub)
