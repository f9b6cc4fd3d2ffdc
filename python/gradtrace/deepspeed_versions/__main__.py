"""``python -m gradtrace.deepspeed_versions`` (deprecated): ``gradtrace-deepspeed-versions``."""

import sys

from gradtrace.deepspeed_versions.command import main

if __name__ == "__main__":
    sys.exit(main())
