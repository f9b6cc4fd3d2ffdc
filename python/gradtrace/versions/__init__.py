"""``gradtrace-versions``: which release of a package changed the gradients.

``command`` is the command (``main``; ``python -m gradtrace.versions`` runs it too) and ``study`` its runs.
The parts: ``releases`` (a distribution's PyPI release list and PEP 440 order), ``envs`` (one environment
per release over a shared base; DeepSpeed's come from ``gradtrace.deepspeed_versions.envs``), ``runner``
(one entry point under one release, captured, and gradtrace-diff), ``cache``, ``bisection`` and ``report``.
DeepSpeed's built-in entry points (the #5248 loop, the gradtrace-train emulation) live in
``gradtrace.deepspeed_versions``. Nothing here imports torch.
"""
