"""Deprecated: ``python -m gradtrace.deepspeed_versions`` still runs ``gradtrace-deepspeed-versions`` (that is,
``gradtrace-versions --package deepspeed``) for this release, and says so on stderr; it goes in the next.

DeepSpeed's part of gradtrace-versions is data now, its description (gradtrace/versions/packages/deepspeed.json);
the #5248 loop, models and mpu it runs for ``--model`` are a study, in tools/repro/ds5248/ (loop.py, model.py,
mpu.py), not in the package.
"""

NOTICE = ("python -m gradtrace.deepspeed_versions is deprecated and goes in the next release: run "
          "gradtrace-deepspeed-versions or gradtrace-versions --package deepspeed")
