"""``gradtrace-versions``: which release of a package changed the gradients.

``command`` is the command (``main``; ``python -m gradtrace.versions`` runs it too; ``alias_main`` is a
description's alias, such as ``gradtrace-deepspeed-versions``) and ``study`` its runs. The parts: ``packages``
(what differs between packages, as data: one description per package, DeepSpeed's ``deepspeed.json``, and the
hooks it names), ``releases`` (a distribution's PyPI release list and PEP 440 order), ``envs`` (one environment
per release over a shared base), ``launch`` (one process per rank), ``runner`` (one entry point under one
release, captured, and gradtrace-diff), ``script_main`` (a user's script as ``python SCRIPT`` would run it),
``cache``, ``bisection`` and ``report``. No module here knows a package by name, and nothing here imports
torch. The built-in loops a description names are studies, in a source checkout's tools/repro.
"""
