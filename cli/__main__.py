"""`python -m lingbot_world.cli ...` (what `torchrun ... -m lingbot_world.cli generate ...` runs in every process)."""
import sys

from . import main

sys.exit(main())
