#!/usr/bin/env python3
"""One #5248 run: the runner now lives in the package (gradtrace.ds5248_run, also what
gradtrace-deepspeed-versions runs). As a script this is `python -m gradtrace.ds5248_run` (same options,
see its docstring); as a module (`import run`, alst.py) it is that module itself, not a copy."""

import sys

from gradtrace import ds5248_run

if __name__ == "__main__":
    sys.exit(ds5248_run.main())
sys.modules[__name__] = ds5248_run
