"""wan/uploads.py on the CPU: the same values on the same or a CPU device (the pinned, non-blocking path runs on
a GPU only: tests/test_fast_speed_cuda.py checks that a chunk then makes no host sync)."""
import torch

from lingbot_world.wan.uploads import upload


def test_upload_keeps_values_and_returns_cpu_tensors_as_they_are():
    t = torch.randn(2, 3, 4)[:, :, 1:3]  # a strided slice, as a chunk's control frames
    out = upload(t, "cpu")
    assert out is t
    assert torch.equal(upload(t, torch.device("cpu")), t)
