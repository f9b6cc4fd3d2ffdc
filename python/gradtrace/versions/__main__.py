"""``python -m gradtrace.versions``: the same command as ``gradtrace-versions``."""

import sys

from gradtrace.versions.command import main

if __name__ == "__main__":
    sys.exit(main())
