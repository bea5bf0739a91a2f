"""The world layer: the model registry (models.py), the one assembly of a causal world (assembly.py: files, checks,
settings, memory plan, load, LoRA) and the session that drives it part by part or chunk by chunk (session.py).

Every door (cli/, nodes/, player/) opens its world through here, and takes what it needs of the layers below from
a world module named for the concern (settings.py's choices, speed.py, sizes.py, cameras.py, keys.py, text.py,
vae.py, launch.py, machine.py); see docs/architecture.md.
"""
from .assembly import open_session
from .errors import WorldError
from .files import WorldFiles
from .frames import ChunkFrames, FixedCondition, to_uint8
from .saving import SavedFiles
from .session import WorldSession
from .settings import ModelSource, TextSettings, WorldSettings

__all__ = ["ChunkFrames", "FixedCondition", "ModelSource", "SavedFiles", "TextSettings", "WorldError", "WorldFiles",
           "WorldSession", "WorldSettings", "open_session", "to_uint8"]
