"""The session layer: one loaded Fast model and its video, driven part by part or chunk by chunk.

Every door (cli/, nodes/, player/) runs the Fast model through `WorldSession`; see session.py.
"""
from .errors import WorldError
from .files import FastFiles
from .saving import SavedFiles
from .frames import ChunkFrames, FixedCondition, to_uint8
from .session import WorldSession
from .settings import TextSettings, WorldSettings

__all__ = ["ChunkFrames", "FastFiles", "FixedCondition", "SavedFiles", "TextSettings", "WorldError", "WorldSession",
           "WorldSettings", "to_uint8"]
