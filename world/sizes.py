"""A video's size and length as the doors check them and show them: the pixel budget of a size ("480*832",
"720p") and the size an image's aspect gives under it, the frame counts a video may have (4n+1) and its latent
frames. The rules are wan/sizes.py's; the doors see them here.
"""
from ..wan.sizes import (MAX_FRAMES, SIZE_AREAS, check_frames, frames_at_most, latent_frames, latent_size,
                         max_area_for, target_size)

__all__ = ["MAX_FRAMES", "MAX_LATENT_FRAMES", "SIZE_AREAS", "check_frames", "frames_at_most", "latent_frames",
           "latent_size", "max_area_for", "target_size"]

MAX_LATENT_FRAMES = latent_frames(MAX_FRAMES)  # the latent frames of the longest video a run makes
