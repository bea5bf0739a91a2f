"""Which ranks split what (parallel/layout.py), the token shards and head regrouping of Ulysses in one process,
and the launch checks that run before any process group exists (parallel/group.py)."""
from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest
import torch

from lingbot_world.parallel import group
from lingbot_world.parallel.layout import Layout, LayoutError, plan_layout, ulysses_degrees
from lingbot_world.parallel.ulysses import SequenceParallel


def test_auto_layouts_for_the_released_model():
    # 40 heads: CFG-parallel for the base model with guidance, CFG x Ulysses on 4 and 8 ranks
    assert plan_layout("auto", 2, 40) == Layout(2, 2, 1)
    assert plan_layout("auto", 4, 40) == Layout(4, 2, 2)
    assert plan_layout("auto", 8, 40) == Layout(8, 2, 4)
    assert plan_layout("auto", 5, 40) == Layout(5, 1, 5)  # odd: Ulysses over every rank
    assert plan_layout("auto", 2, 40, guidance=False) == Layout(2, 1, 2)  # guide 1: no second pass to split
    assert plan_layout("auto", 2, 40, model="fast") == Layout(2, 1, 2)  # no CFG in the Fast model
    assert plan_layout("auto", 1, 40) == Layout(1, 1, 1) and plan_layout("off", 1, 40) == Layout(1, 1, 1)
    assert plan_layout("ulysses", 8, 40) == Layout(8, 1, 8)
    assert ulysses_degrees(40) == [2, 4, 5, 8, 10, 20, 40]


def test_groups_of_cfg_times_ulysses():
    lay = Layout(8, 2, 4)
    assert lay.sp_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lay.cfg_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [lay.cfg_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [lay.sp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert "CFG-parallel" in lay.describe() and "4 ranks per pass" in lay.describe()


@pytest.mark.parametrize("mode, world, heads, kw, match", [
    ("ulysses", 3, 40, {}, "40 attention heads do not split evenly over 3 ranks; use 2, 4, 5, 8, 10"),
    ("ulysses", 64, 40, {}, "64 ranks per pass but the model has only 40 attention heads"),
    ("cfg", 3, 40, {}, "even number of processes, not 3"),
    ("cfg", 2, 40, {"model": "fast"}, "Fast model has no classifier-free guidance"),
    ("cfg", 6, 40, {}, "do not split evenly over 3 ranks"),
    ("auto", 6, 40, {}, "start 2, 4, 5, 8, 10"),
    ("cfg", 1, 40, {}, "needs several processes, one per GPU: launch with torchrun"),
    ("off", 2, 40, {}, "--parallel is off"),
])
def test_refusals_say_what_works(mode, world, heads, kw, match):
    with pytest.raises(LayoutError, match=match):
        plan_layout(mode, world, heads, **kw)


def test_shards_pad_to_a_multiple_of_the_degree():
    # 27 tokens over 4 ranks: 7 each, the last rank holds 6 real tokens and one padding row
    sps = [SequenceParallel(4, r) for r in range(4)]
    assert [sp.shard(27) for sp in sps] == [(0, 7), (7, 7), (14, 7), (21, 7)]
    h = torch.arange(2 * 27 * 3, dtype=torch.float32).reshape(2, 27, 3)
    cos, sin = torch.rand(27, 5), torch.rand(27, 5)
    parts = [sp.scatter(h, h + 1, (cos, sin)) for sp in sps]
    joined = torch.cat([p[0] for p in parts], dim=1)
    assert joined.shape == (2, 28, 3) and torch.equal(joined[:, :27], h) and not joined[:, 27:].any()
    assert torch.equal(torch.cat([p[1] for p in parts], dim=1)[:, :27], h + 1)
    c = torch.cat([p[2][0] for p in parts])
    s = torch.cat([p[2][1] for p in parts])
    assert torch.equal(c[:27], cos) and torch.equal(s[:27], sin) and c[27].eq(1).all() and s[27].eq(0).all()
    assert all(p[0].data_ptr() != h.data_ptr() for p in parts)  # fresh tensors: the blocks update them in place


def _threaded_all_to_all(monkeypatch, n: int):
    """The all-to-all of n ranks played by n threads of this process (rank i's chunk j lands in rank j's slot i)."""
    barrier = threading.Barrier(n)
    sends: list = [None] * n

    def exchange(self, recv, send):
        sends[self.rank] = send
        barrier.wait()
        for i in range(n):
            recv[i].copy_(sends[i][self.rank])
        barrier.wait()

    monkeypatch.setattr(SequenceParallel, "_all_to_all", exchange)


def _on_every_rank(sps, fn):
    with cf.ThreadPoolExecutor(len(sps)) as pool:
        return list(pool.map(fn, sps, range(len(sps))))


@pytest.mark.parametrize("n, heads", [(4, 8), (5, 40), (8, 40)])
def test_head_regrouping_is_the_all_to_all_of_ulysses(monkeypatch, n, heads):
    b, per, d = 2, 3, 5
    _threaded_all_to_all(monkeypatch, n)
    sps = [SequenceParallel(n, r) for r in range(n)]
    x = torch.randn(b, n * per, heads, d)
    mine = [x[:, r * per:(r + 1) * per] for r in range(n)]
    hn = heads // n
    by_heads = _on_every_rank(sps, lambda sp, r: sp.to_heads(mine[r]))
    for r, got in enumerate(by_heads):
        assert torch.equal(got, x[:, :, r * hn:(r + 1) * hn])  # every token, rank r's heads, in token order
    back = _on_every_rank(sps, lambda sp, r: sp.to_tokens(by_heads[r]))
    for r, got in enumerate(back):
        assert torch.equal(got, mine[r])


def test_split_attention_equals_whole_attention_with_padding(monkeypatch):
    """attend() over 3 ranks of 10 tokens (padded to 12): the padding never becomes a key."""
    n, tokens, heads, d = 3, 10, 6, 4
    _threaded_all_to_all(monkeypatch, n)
    sps = [SequenceParallel(n, r) for r in range(n)]
    q, k, v = (torch.randn(1, tokens, heads, d) for _ in range(3))
    whole = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    def rank(sp, r):
        h, _, _ = sp.scatter(torch.zeros(1, tokens, 1), None, (torch.zeros(tokens, 1), torch.zeros(tokens, 1)))
        cut = [sp._cut(t.flatten(2), tokens).view(1, -1, heads, d) for t in (q, k, v)]
        return sp.attend(lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
            a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2)).transpose(1, 2), *cut)

    parts = _on_every_rank(sps, rank)
    got = torch.cat(parts, dim=1)[:, :tokens]
    torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-6)


def test_launch_checks_before_any_process_group(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(group.LaunchError, match="2 processes were started on this machine but it has 1 CUDA GPU"):
        group.rank_device("cuda", 1, 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(group.LaunchError, match="no CUDA GPU is available"):
        group.rank_device("cuda", 0, 2)
    assert group.rank_device("cpu", 1, 2) == torch.device("cpu")

    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    with pytest.raises(group.LaunchError, match="no NCCL"):
        group.Session.start("cuda")
    with pytest.raises(group.LaunchError, match="--parallel-timeout"):
        group.Session.start("cpu", timeout_s=0)
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(group.LaunchError, match="do not fit WORLD_SIZE=2"):
        group.Session.start("cpu")
    assert group.launched_by_torchrun()
    monkeypatch.delenv("MASTER_PORT")
    assert not group.launched_by_torchrun()


@pytest.mark.parametrize("degree", [5, 8])
def test_a_forward_split_over_5_or_8_ranks_equals_the_whole_forward(monkeypatch, degree):
    """The released model's 40 heads over 5 and 8 ranks (threads standing in for the processes), 45 tokens (padded
    to 50 and 48), camera on: the DiT forward equals the unsplit one."""
    from lingbot_world.wan.dit.model import DiTConfig, WanDiT

    _threaded_all_to_all(monkeypatch, degree)
    barrier = threading.Barrier(degree)
    shards: list = [None] * degree

    def gather(self, out):
        shards[self.rank] = out
        barrier.wait()
        joined = torch.cat(shards, dim=1)[:, :self.tokens]
        barrier.wait()
        return joined

    monkeypatch.setattr(SequenceParallel, "gather", gather)
    cfg = DiTConfig.tiny(dim=320, num_heads=40, num_layers=2, text_dim=16, text_len=8)
    torch.manual_seed(0)
    whole = WanDiT(cfg).eval()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(1, 16, 5, 6, 6, generator=g), torch.randn(1, 20, 5, 6, 6, generator=g)
    cam, ctx = torch.randn(1, 384, 5, 6, 6, generator=g), torch.randn(1, 8, 16, generator=g)
    t = torch.tensor([500])
    with torch.no_grad():
        ref = whole(x, t, ctx, y, camera=cam)
    models = []
    for r in range(degree):
        m = WanDiT(cfg).eval()
        m.load_state_dict(whole.state_dict())
        m.set_seq_parallel(SequenceParallel(degree, r, num_heads=40))
        models.append(m)

    def run(m, r):
        with torch.no_grad():
            return m(x, t, ctx, y, camera=cam)

    outs = _on_every_rank(models, lambda m, r: run(m, r))
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_split_objects_hold_their_group_weakly_so_closing_the_session_frees_it():
    """Only the session holds a process group strongly: a group kept alive past the session's close keeps gloo threads
    that abort the process at interpreter exit. A split used after its group is gone says so in one line."""
    import gc

    from lingbot_world.parallel.cfg import CFGParallel
    from lingbot_world.parallel.messages import ParallelError
    from lingbot_world.parallel.ulysses import SequenceParallel

    class Group:  # stands in for a ProcessGroup (any weak-referenceable object)
        pass

    g = Group()
    sp, cfg = SequenceParallel(2, 0, g, 4), CFGParallel(1, g)
    assert sp.group() is g and cfg.group() is g
    assert SequenceParallel(2, 1).group() is None  # the default group
    del g
    gc.collect()
    for split in (sp, cfg):
        with pytest.raises(ParallelError, match="process group was closed"):
            split.group()


def test_a_started_session_owns_its_group_and_close_releases_it(monkeypatch):
    from lingbot_world.parallel import group as G

    calls = []
    monkeypatch.setattr(G, "_init", lambda backend, device, timeout: calls.append(("init", backend)))
    monkeypatch.setattr(G.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(G.dist, "destroy_process_group", lambda group=None: calls.append(("destroy", group)))
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    s = G.Session.start("cpu", timeout_s=5)
    s.sp_group = s.cfg_group = object()
    s.close()
    assert calls == [("init", "gloo"), ("destroy", None)]
    assert s.sp_group is None and s.cfg_group is None and s.control is None
    s.close()  # a second close does nothing
    assert len(calls) == 2
