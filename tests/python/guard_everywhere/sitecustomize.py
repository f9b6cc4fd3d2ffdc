"""For test_guard.py: with GRADTRACE_TEST_MODE set (e.g. "full+guard"), every gradtrace.attach of the process
captures in that mode, so the suite's own runners of each attach path (lightning_runs.py, hf_runs.py,
dtensor_runs.py, pipeline_runs.py) run under the guard unchanged. Put on PYTHONPATH by the test only."""

import os

if os.environ.get("GRADTRACE_TEST_MODE"):
    import gradtrace

    _attach = gradtrace.attach

    def attach(obj, out_dir, **options):
        options["mode"] = os.environ["GRADTRACE_TEST_MODE"]
        return _attach(obj, out_dir, **options)

    gradtrace.attach = attach
