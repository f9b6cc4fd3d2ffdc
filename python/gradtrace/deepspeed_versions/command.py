"""gradtrace-deepspeed-versions: `gradtrace-versions --package deepspeed` under its old name, with its old
defaults (a DeepSpeed config, sp 2, the single-rank reference, environments and cache where they were).
Its documentation is gradtrace.versions.command's."""

import sys

from gradtrace.versions import command


def main(argv=None):
    return command.main(sys.argv[1:] if argv is None else argv, prog="gradtrace-deepspeed-versions",
                        package="deepspeed")


if __name__ == "__main__":
    sys.exit(main())
