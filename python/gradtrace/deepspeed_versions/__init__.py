"""DeepSpeed's part of ``gradtrace-versions``, and ``gradtrace-deepspeed-versions`` (``command``: the same
command with ``--package deepspeed``; ``python -m gradtrace.deepspeed_versions`` runs it too).

``envs`` builds DeepSpeed's environments (a pinned torch base before 0.15, import stubs); ``entries`` the
built-in entry points' command lines: the DeepSpeed #5248 Ulysses loop, ``ds5248_run`` (the loop and its
launcher), ``ds5248_model`` (the models, data and loss recipes) and ``ds5248_mpu`` (the Megatron-style mpu),
and the gradtrace-train emulation. Nothing here imports torch or DeepSpeed at import time except
``ds5248_model``.
"""
