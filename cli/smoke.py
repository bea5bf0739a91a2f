"""`lingbot-world smoke`: a tiny random-weight DiT forward on the CPU (checks the install)."""


def add_parser(sub) -> None:
    p = sub.add_parser("smoke", help="tiny random-weight DiT forward on CPU (install check)")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    import torch

    from ..wan.dit.model import DiTConfig, WanDiT

    torch.manual_seed(0)
    cfg = DiTConfig.tiny()
    model = WanDiT(cfg).eval()
    f, h, w = 3, 8, 8
    x = torch.randn(1, cfg.out_dim, f, h, w)
    y = torch.randn(1, cfg.in_dim - cfg.out_dim, f, h, w)
    ctx = torch.randn(1, 7, cfg.text_dim)
    cam = torch.randn(1, 384, f, h, w)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(x, torch.tensor([999]), ctx, y, camera=cam)
    print(f"tiny DiT forward: out {tuple(out.shape)} finite={bool(out.isfinite().all())} "
          f"in {time.perf_counter() - t0:.2f}s")
    return 0
