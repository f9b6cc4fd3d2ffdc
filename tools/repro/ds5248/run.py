#!/usr/bin/env python3
"""One #5248 run, the study's command line: runs loop.py's main (the loop; options in its docstring), which
gradtrace-versions --package deepspeed --model ds5248 / moe runs too (DeepSpeed's description names this file).

    .venv/bin/python tools/repro/ds5248/run.py --sp 2 --zero-stage 2 --loss loss --out traces/sp2-z2-loss
"""

import sys

import loop

if __name__ == "__main__":
    sys.exit(loop.main())
