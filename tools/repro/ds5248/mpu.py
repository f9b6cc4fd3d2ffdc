"""The Ulysses mpu now lives in the package (gradtrace.ds5248_mpu); `import mpu` is that module itself."""

import sys

from gradtrace import ds5248_mpu

sys.modules[__name__] = ds5248_mpu
