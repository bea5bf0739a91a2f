"""memory/bounds.py: a video that cannot fit the machine at all is refused from its shapes, with the numbers."""
import pytest

from lingbot_world.memory.bounds import HOST_BYTES_PER_PIXEL_FRAME, VideoTooLargeError, check_video_fits
from lingbot_world.memory.estimates import estimate_activation_bytes
from lingbot_world.wan.dit.model import DiTConfig

GIB = 2**30
FULL = DiTConfig()  # Wan2.2 A14B expert: dim 5120, 40 layers


def test_reference_sizes_pass_on_consumer_machines():
    for frames, h, w in ((81, 464, 832), (81, 720, 1280), (161, 720, 1280)):
        needs = check_video_fits(frames, h, w, FULL, total_ram=32 * GIB, total_vram=16 * GIB)
        assert needs.host_bytes == frames * h * w * HOST_BYTES_PER_PIXEL_FRAME
        assert needs.device_bytes == estimate_activation_bytes(frames, h, w, FULL, cfg_batch=False)


def test_too_many_frames_for_the_gpu():
    with pytest.raises(VideoTooLargeError) as e:
        check_video_fits(401, 720, 1280, FULL, total_ram=64 * GIB, total_vram=24 * GIB, what="--frames 401")
    msg = str(e.value)
    assert msg.startswith("401 frames at 1280x720 (--frames 401) needs at least 27.4 GiB of GPU memory")
    assert "the GPU's 24.0 GiB" in msg


def test_too_many_frames_for_ram_and_cpu_compute_counts_activations():
    with pytest.raises(VideoTooLargeError, match=r"100001 frames at 112x48 needs at least 24\.0 GiB of RAM"):
        check_video_fits(100_001, 48, 112, DiTConfig.tiny(), total_ram=16 * GIB, total_vram=8 * GIB)
    # on the CPU the DiT activations live in RAM too: 161 frames at 720p need ~25 GiB there
    with pytest.raises(VideoTooLargeError, match="plus the model's activations on the CPU"):
        check_video_fits(161, 720, 1280, FULL, total_ram=16 * GIB)
    check_video_fits(161, 720, 1280, FULL, total_ram=16 * GIB, total_vram=24 * GIB)  # on a GPU it fits
