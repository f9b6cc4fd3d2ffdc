"""The #5248 models now live in the package (gradtrace.ds5248_model, so a pip user has them); this name
stays for the repro's scripts and tests: `import model` is that module itself, not a copy."""

import sys

from gradtrace import ds5248_model

sys.modules[__name__] = ds5248_model
