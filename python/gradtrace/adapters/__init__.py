"""The adapters: capturing live PyTorch training, one adapter per framework, and the parts they share.

Adapters: ``ddp_adapter``, ``fsdp2_adapter``, ``manual_adapter`` (hand-written parallelism, DTensor TP),
``hf_adapter`` (Hugging Face Trainer), ``lightning_adapter`` (Lightning's Trainer and Fabric) and
``deepspeed_adapter`` (with ``deepspeed_zero3``, ``deepspeed_pipe`` for the PipelineEngine and
``deepspeed_divisors``). Shared: ``rank_recorder`` (the one writer path), ``step_protocol`` (where FINAL is
taken for each way an optimizer is stepped), ``layout`` (degrees, groups, parameter kinds), ``adapter_base``,
``dtensor`` and ``loss_recipes``. Each module imports torch (or
DeepSpeed, transformers) itself when used; this package imports nothing, so ``gradtrace`` stays free of
torch until an adapter is asked for (``gradtrace.ddp_adapter`` loads it lazily).
"""
