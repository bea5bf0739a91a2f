"""Keys as the doors read them and walk them: an action string ("w-10,a-10,iw-15"), key files (wasd_action.npy /
ijkl_action.npy, or one [N, 4] .npy) and the Act model's files (action.npy + poses.npy + intrinsics.npy); keys fitted
to a video's length, and walked into the camera path they steer. loaders/action_files.py reads the files;
wan/control/ holds the grammar and the walk. world/controls.py builds a video's control from these; a door that
shows the keys' path itself (a ComfyUI node) uses them directly.
"""
from ..loaders.action_files import (ACT_FILE, IJKL_FILE, WASD_FILE, ActFiles, KeySource, has_act_files,
                                    read_act_folder, read_key_files)
from ..wan.control.act_control import check_actions as check_act_keys  # an Act input's [N, 4] w a s d
from ..wan.control.act_to_camera import keys_to_camera
from ..wan.control.actions import GRAMMAR, KeyTimeline, keys_for_video

__all__ = ["ACT_FILE", "GRAMMAR", "IJKL_FILE", "WASD_FILE", "ActFiles", "KeySource", "KeyTimeline", "check_act_keys",
           "has_act_files", "keys_for_video", "keys_to_camera", "read_act_folder", "read_key_files"]
