#!/usr/bin/env python3
"""One #5248 run, the study's command line: runs gradtrace.deepspeed_versions.ds5248_run's main (the code,
which gradtrace-deepspeed-versions runs too; options in its docstring).

    .venv/bin/python tools/repro/ds5248/run.py --sp 2 --zero-stage 2 --loss loss --out traces/sp2-z2-loss
"""

import sys

from gradtrace.deepspeed_versions import ds5248_run

if __name__ == "__main__":
    sys.exit(ds5248_run.main())
