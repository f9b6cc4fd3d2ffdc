"""``python -m gradtrace.matrix``: the gradtrace-matrix command."""

import sys

from gradtrace.matrix.command import main

sys.exit(main())
