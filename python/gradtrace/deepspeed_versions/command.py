"""Deprecated: gradtrace.deepspeed_versions.command.main is gradtrace.versions.command.alias_main under the name
gradtrace-deepspeed-versions (the console script now points there); it says so on stderr and goes in the next release."""

import sys

from gradtrace.deepspeed_versions import NOTICE
from gradtrace.versions import command


def main(argv=None):
    print(f"gradtrace-deepspeed-versions: {NOTICE}", file=sys.stderr)
    return command.alias_main(argv, prog="gradtrace-deepspeed-versions")


if __name__ == "__main__":
    sys.exit(main())
