"""DeepSpeed's PipelineEngine as the DeepSpeed adapter captures it.

``engine.train_batch()`` runs a schedule of instructions (load, forward, backward, send/receive, reduce
grads, optimizer step) through the class's ``_INSTRUCTION_MAP``; ``engine.backward`` and ``engine.step``
refuse to be called in pipeline mode, so the hooks of a plain DeepSpeedEngine never fire. The adapter gives
the engine instance its own copy of that map (an instance attribute shadows the class's; ``detach()``
removes it) in which:

- ``ForwardPass`` numbers the micro-step (one forward per micro-batch on every stage) and, on the last
  stage, records the micro-batch's loss (``engine.loss``, before DeepSpeed divides it by gas);
- ``OptimizerStep`` writes FINAL before ``_take_model_step`` (each parameter this stage holds, as
  ``safe_get_full_grad`` gives it) and the optimizer-step StepInfo after it.

PRE/POST come from the same reduction hooks as a DeepSpeedEngine (``ReduceGrads`` reaches
``allreduce_and_copy`` at ZeRO-0, ZeRO-1's reduction otherwise), within the stage's data-parallel group. The
trace names the whole model, each parameter with its stage (gradtrace.adapters.pipeline.whole_table, a
collective over the pipeline group at attach): PipelineModule names a layer's parameters by its global layer
index ("2.weight"), which is what an nn.Sequential of the same layers calls them, so the diff joins the
stages against an unpipelined reference by itself. The micro-batches per step are gas.
"""

from __future__ import annotations

import sys

from .pipeline import PipelineInfo

SCHEDULE = "deepspeed.TrainSchedule"


def is_pipeline_engine(engine) -> bool:
    """Whether ``engine`` is DeepSpeed's PipelineEngine (imported only when deepspeed already is)."""
    pipe = sys.modules.get("deepspeed.runtime.pipe.engine")
    return pipe is not None and isinstance(engine, pipe.PipelineEngine)


def pipeline_info(engine) -> PipelineInfo:
    """This rank's stage of the engine's pipeline: its stage index and module, the number of stages and the
    pipeline process group."""
    info = PipelineInfo()
    info.stages = [(int(engine.stage_id), engine.module)]
    info.num_stages = int(engine.num_stages)
    info.group = engine.grid.get_pipe_parallel_group()
    info.schedule = SCHEDULE  # its micro-batches are gas (Config.gas): not a schedule's own count to scale by

    return info


def pipe_ranks(engine) -> list[int]:
    """The global ranks of this rank's pipeline, in stage order."""
    return [int(r) for r in engine.grid.pp_group]


def install(capture, engine) -> None:
    """Gives ``engine`` its own instruction map whose ForwardPass and OptimizerStep entries call ``capture``
    (a DeepSpeedCapture): ``pipeline_forward_begins()``/``pipeline_forward_done()`` around each forward,
    ``final_if_wanted()`` before the optimizer step and ``end_optimizer_step()`` after it, as a DeepSpeedEngine's
    boundary ``step()`` does."""
    from deepspeed.runtime.pipe import schedule

    base = dict(type(engine)._INSTRUCTION_MAP)
    forward, step = base[schedule.ForwardPass], base[schedule.OptimizerStep]

    def forward_pass(self, *args, **kwargs):
        capture.pipeline_forward_begins()
        result = forward(self, *args, **kwargs)
        capture.pipeline_forward_done()
        return result

    def optimizer_step(self, *args, **kwargs):
        capture.final_if_wanted()
        result = step(self, *args, **kwargs)
        capture.end_optimizer_step()
        return result

    capture._patch(engine, "_INSTRUCTION_MAP",
                   lambda _original: {**base, schedule.ForwardPass: forward_pass, schedule.OptimizerStep: optimizer_step})
    capture.hooks += [f"{type(engine).__name__}._exec_forward_pass", f"{type(engine).__name__}._exec_optimizer_step"]
