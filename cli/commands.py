"""Registry of CLI sub-commands. Each module adds its parser with `add_parser(sub)`."""


def register(sub) -> None:
    from . import check_expert, compare, convert_expert, convert_lowp, generate, play, smoke

    for mod in (generate, play, compare, check_expert, convert_expert, convert_lowp, smoke):
        mod.add_parser(sub)
