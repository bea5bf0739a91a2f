"""`lingbot-world smoke`: a tiny random-weight DiT forward on the CPU (checks the install; world/demos.py)."""


def add_parser(sub) -> None:
    p = sub.add_parser("smoke", help="tiny random-weight DiT forward on CPU (install check)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..world.demos import tiny_forward

    shape, finite, seconds = tiny_forward()
    print(f"tiny DiT forward: out {shape} finite={finite} in {seconds:.2f}s")
    return 0
