"""Pipeline parallelism (torch.distributed.pipelining) as the adapters see it: which stages this rank
runs, the pipeline's process group, the schedule's micro-batches and whether it scales gradients, and
the whole model's parameter table that every rank of a pipelined run records (FORMAT.md 4.1, 1.5).

    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
    cap = gradtrace.attach(schedule, "traces/pp", optimizer=opt)

An adapter given a schedule (or a ``PipelineStage``, or a list of them) captures the stages' modules;
the table names every stage's parameters, in stage order, by the names the stage modules give them
(build stages from the whole model by deleting what other stages hold, as torchtitan does, and the
names are the unpipelined model's: the diff then joins stages against an unpipelined reference by
itself). A name two stages share is a tied parameter (each stage holds a copy; their gradients are
the stage's own share unless the training sums them).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PipelineInfo:
    """This rank's part of a pipeline: ``stages`` (stage index, module) it runs, ``num_stages`` in all,
    ``group`` (the pipeline ProcessGroup, None = the world), ``n_microbatches``, ``scale_grads`` and
    ``schedule`` (the class name) when a schedule was given (None / "" otherwise)."""

    stages: list = field(default_factory=list)
    objects: list = field(default_factory=list)  # the PipelineStage objects, in stage order
    num_stages: int = 1
    group: object = None
    n_microbatches: int | None = None
    scale_grads: bool | None = None
    schedule: str = ""

    @property
    def module(self):
        """The module whose forwards count micro-batches: the first stage this rank runs."""
        return self.stages[0][1]

    def named_parameters(self):
        """(name, parameter) of every stage this rank runs, in stage order; a DDP-wrapped stage by its
        module's names (as the unpipelined model names them)."""
        for _, module in self.stages:
            yield from unwrap(module).named_parameters()

    def stage_of(self) -> dict:
        """id(parameter) -> the stage index holding it on this rank."""
        return {id(p): index for index, module in self.stages for p in module.parameters()}

    def only_stage(self, adapter: str):
        """The module of this rank's one stage; ValueError for several (an interleaved schedule)."""
        if len(self.stages) != 1:
            raise ValueError(f"gradtrace.{adapter}: this rank runs {len(self.stages)} pipeline stages "
                             f"({[i for i, _ in self.stages]}); {adapter} captures one stage per rank (one DDP "
                             f"model): use manual_adapter for an interleaved schedule")
        return self.stages[0][1]

    def config(self) -> dict:
        """The Config fields of the pipeline (format 1.5)."""
        out = {"pp_stages": self.num_stages}
        if self.n_microbatches is not None:
            out["pp_microbatches"] = int(self.n_microbatches)
        if self.schedule:
            out["pp_schedule"] = self.schedule
        if self.scale_grads is not None:
            out["pp_scale_grads"] = bool(self.scale_grads)
        return out


def unwrap(module):
    """A DistributedDataParallel stage's module, else the module itself."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def is_pipeline(obj) -> bool:
    """Whether ``obj`` is a pipeline schedule, a PipelineStage or a non-empty list of stages."""
    if isinstance(obj, (list, tuple)):
        return bool(obj) and all(_is_stage(s) for s in obj)
    return _is_stage(obj) or _is_schedule(obj)


def _is_stage(obj) -> bool:
    return all(hasattr(obj, a) for a in ("submod", "stage_index", "num_stages"))


def _is_schedule(obj) -> bool:
    return hasattr(obj, "_n_microbatches") and (hasattr(obj, "_stage") or hasattr(obj, "_stages"))


def of(obj) -> PipelineInfo | None:
    """The PipelineInfo of ``obj`` when it is a pipeline (is_pipeline), else None: what an adapter was handed."""
    return resolve(obj) if is_pipeline(obj) else None


def resolve(obj) -> PipelineInfo:
    """The PipelineInfo of a schedule (its stages, micro-batches, scale_grads), a stage or a list of stages."""
    info = PipelineInfo()
    if _is_schedule(obj):
        stages = list(obj._stages) if hasattr(obj, "_stages") else [obj._stage]
        info.n_microbatches = int(obj._n_microbatches)
        info.scale_grads = bool(getattr(obj, "scale_grads", True))
        info.schedule = type(obj).__name__
    else:
        stages = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    stages.sort(key=lambda s: s.stage_index)
    info.objects = stages
    info.stages = [(int(s.stage_index), s.submod) for s in stages]
    info.num_stages = int(stages[0].num_stages)
    info.group = getattr(stages[0], "group", None)
    return info


class _Restore:
    """Undoes before_scale_grads on one stage (a handle like a hook's: ``remove()``)."""

    def __init__(self, stage):
        self._stage = stage

    def remove(self) -> None:
        self._stage.__dict__.pop("scale_grads", None)


def before_scale_grads(info: PipelineInfo, callback) -> list:
    """Runs ``callback()`` before each stage divides its gradients by the micro-batches (the schedule's
    scale_grads, in place): a reduction whose output an adapter reads late (FSDP2's reduce-scatter) is read
    as the collective left it. Returns handles whose ``remove()`` undoes it."""
    handles = []
    for stage in info.objects:
        scale = stage.scale_grads

        def scale_after(factor, scale=scale):
            callback()
            return scale(factor)

        stage.scale_grads = scale_after
        handles.append(_Restore(stage))
    return handles


def layout_groups(info: PipelineInfo, given: dict | None) -> dict:
    """The groups a pipelined layout records: ``pp`` (the pipeline's ranks) and, unless given, ``dp``:
    the ranks at this rank's position in their own pipeline group (its stages' data-parallel replicas;
    a collective, as every rank attaches)."""
    from .layout import group_ranks, same_position_ranks, world_and_rank

    given = dict(given or {})
    pp = group_ranks(given.get("pp", info.group))
    out = {"pp": pp}
    if "dp" not in given:
        world, rank = world_and_rank()
        out["dp"] = same_position_ranks(pp, world, rank)
    return {**out, **given}


def whole_table(local: list[dict], stage_of_entry: list[int], info: PipelineInfo, pp_ranks: list[int]) -> \
        tuple[list[dict], list[int]]:
    """The whole model's table from every pipeline rank's ``local`` entries (a collective over the
    pipeline's group): entries in stage order with their ``stages``, a name two stages share merged
    into one (a tied parameter; shapes and dtypes must agree). Returns the table and, per local entry,
    its index in it."""
    import torch.distributed as tdist

    mine = [(stage_of_entry[k], entry) for k, entry in enumerate(local)]
    gathered = [mine]
    if tdist.is_available() and tdist.is_initialized() and len(pp_ranks) > 1:
        gathered = [None] * len(pp_ranks)
        tdist.all_gather_object(gathered, mine, group=info.group)
    by_stage: dict[int, list[dict]] = {}  # each stage comes from the one rank of the group that runs it
    for part in gathered:
        for stage, entry in part:
            by_stage.setdefault(stage, []).append(entry)
    table: list[dict] = []
    where: dict[str, int] = {}
    for stage in sorted(by_stage):
        for entry in by_stage[stage]:
            name = entry["name"]
            if name in where:
                _tie(table[where[name]], entry, stage)
                continue
            where[name] = len(table)
            table.append({**entry, "stages": [stage]})
    return table, [where[e["name"]] for e in local]


def _tie(kept: dict, other: dict, stage: int) -> None:
    """A name held by a second stage: a tied parameter, each stage holding a copy."""
    name = kept["name"]
    if list(kept["shape"]) != list(other["shape"]) or kept["dtype"] != other["dtype"]:
        raise ValueError(f"gradtrace: parameter {name!r} is held by pipeline stages {kept['stages'][0]} and {stage} "
                         f"with different shapes or dtypes ({kept['shape']} {kept['dtype']} vs {other['shape']} "
                         f"{other['dtype']}): give the stages' parameters distinct names")
    if stage not in kept["stages"]:
        if len(kept["stages"]) >= 2:
            raise ValueError(f"gradtrace: parameter {name!r} is held by more than two pipeline stages "
                             f"({kept['stages'] + [stage]}); a tied parameter may be shared by two")
        kept["stages"] = sorted(kept["stages"] + [stage])
