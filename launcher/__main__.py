"""python -m commrt.launcher: the same as the commrt-launch command."""
import sys

from commrt.launcher.cli import main

sys.exit(main())
