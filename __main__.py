"""`python -m lingbot_world COMMAND` when the package is installed, and `python path/to/ComfyUI-LingBot-World COMMAND`
from a ComfyUI install, where the folder is not installed as a package: the folder is then loaded as the package
`lingbot_world` by its path (nothing is added to sys.path by this file)."""
import sys

if __package__:
    from .cli import main
else:
    import importlib.util
    import os

    _root = os.path.dirname(os.path.abspath(__file__))
    if "lingbot_world" not in sys.modules:
        _spec = importlib.util.spec_from_file_location("lingbot_world", os.path.join(_root, "__init__.py"),
                                                       submodule_search_locations=[_root])
        _package = importlib.util.module_from_spec(_spec)
        sys.modules["lingbot_world"] = _package
        _spec.loader.exec_module(_package)
    from lingbot_world.cli import main

sys.exit(main())
