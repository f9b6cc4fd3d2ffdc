"""``gradtrace-deepspeed-versions`` and the DeepSpeed studies it runs.

``command`` is the command (``main``; ``python -m gradtrace.deepspeed_versions`` runs it too). Its parts:
``releases`` (PyPI's release list), ``envs`` (one environment per release), ``runner`` (one entry point
under one release, captured), ``cache``, ``bisection`` and ``report``. The built-in entry point is the
DeepSpeed #5248 Ulysses loop: ``ds5248_run`` (the loop and its launcher), ``ds5248_model`` (the models,
data and loss recipes) and ``ds5248_mpu`` (the Megatron-style mpu). Nothing here imports torch or
DeepSpeed at import time except ``ds5248_model``.
"""
