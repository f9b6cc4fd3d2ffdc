"""The README's wheel block ("Install", the block with `auditwheel repair`), for tools/wheel-check to run as
written: prints its command lines, one per line, with the output folder `dist` replaced by the check's own
(argv[2]), so that the check builds, repairs and installs exactly what the README tells a user to."""

import re
import sys


def main(readme, dist):
    blocks = re.findall(r"^```sh\n(.*?)^```", open(readme).read(), re.S | re.M)
    (block,) = [b for b in blocks if "auditwheel repair" in b]
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if len(lines) != 4 or not lines[-1].startswith("pip install "):
        sys.exit(f"{readme}: the wheel block should be sdist, wheel, repair, install; it is {lines}")
    for line in lines:
        print(re.sub(r"(?<![\w/.-])dist(?=/|\s|$)", dist, line))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
