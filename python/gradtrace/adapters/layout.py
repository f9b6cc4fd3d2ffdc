"""The parallel layout a trace records (FORMAT.md 4.1): degrees, named process
groups with their global ranks, this rank's coordinates, and per parameter
the group that reduces its gradient and how (DENSE, EXPERT, TP_SHARD,
REPLICATED).

    layout = Layout.infer(groups={"cp": cp_group}, cp_kind="all-gather")
    layout = Layout.infer(groups={"tp": tp_group}, rules=[(r"\\.qkv\\.", {"kind": "TP_SHARD", "partition_dim": 0})])

``infer`` reads what torch.distributed shows (world, this rank) and the
groups it is given (a ProcessGroup, a list of global ranks, or None for the
whole world); each conventional group name sets its degree and this rank's
coordinate. Keywords override anything inferred. torch is imported only
when a ProcessGroup has to be resolved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DEGREES = ("dp", "sp", "cp", "tp", "pp", "ep", "edp", "replicate")  # conventional group names that are degrees
KINDS = ("DENSE", "EXPERT", "TP_SHARD", "REPLICATED")
# Expert parameters of the common MoE layouts, by name: HF Mixtral/Qwen-MoE `...experts.3.w1`, Megatron
# `...experts.local_experts.0...`, DeepSpeed `...deepspeed_experts.0...`, torchtitan's grouped `moe.experts.w1`.
# Not `shared_experts.` / `shared_expert.` (dense: every token passes them) nor the router (`gate`).
EXPERT_NAMES = r"(^|\.)(local_|deepspeed_)?experts\."
_RULE_KEYS = {"kind", "grad_group", "partition_dim", "shard_count"}


def group_ranks(group) -> list[int]:
    """Global ranks of ``group`` in group order: a list passes through, None is the whole world."""
    if isinstance(group, (list, tuple, range)):
        return [int(r) for r in group]
    import torch.distributed as tdist

    if not tdist.is_initialized():
        return [0]
    if group is None:
        return list(range(tdist.get_world_size()))
    return [int(r) for r in tdist.get_process_group_ranks(group)]


def same_position_ranks(group: list[int], world: int, rank: int) -> list[int]:
    """The ranks at this rank's position in their own group of the same kind (a collective: every rank
    gathers every rank's group): the expert-data-parallel ranks from the ep groups, a pipeline stage's
    data-parallel replicas from the pp groups."""
    import torch.distributed as tdist

    groups = [group]
    if world > 1 and tdist.is_available() and tdist.is_initialized():
        groups = [None] * world
        tdist.all_gather_object(groups, list(group))
    mine = group.index(rank)
    return [r for r, g in enumerate(groups) if g and r in g and g.index(r) == mine] if world > 1 else [rank]


def world_and_rank() -> tuple[int, int]:
    """(world size, rank) of the default process group; (1, 0) without one."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_world_size(), tdist.get_rank()
    return 1, 0


@dataclass
class Layout:
    """Degrees (0 = not recorded), groups (name -> global ranks of this rank's
    group) and per-parameter rules ((regex, fields), first match wins;
    unmatched parameters are ``default_kind`` reduced over ``default_group``). ``gas_given``:
    False when ``infer`` was not told gas (then 1 is recorded)."""

    world: int = 1
    rank: int = 0
    degrees: dict = field(default_factory=dict)
    cp_kind: str = ""
    gas: int = 1
    groups: dict = field(default_factory=dict)
    rules: list = field(default_factory=list)
    default_group: str = "dp"
    default_kind: str = "DENSE"
    gas_given: bool = True
    inferred: list = field(default_factory=list)  # what infer() decided that no keyword said, one sentence each

    @classmethod
    def infer(cls, groups: dict | None = None, *, rules=(), default_group: str | None = None,
              default_kind: str = "DENSE", cp_kind: str = "", gas: int | None = None, **degrees) -> "Layout":
        """``groups``: name -> ProcessGroup, global ranks or None (world). ``degrees``: dp, sp, cp,
        tp, pp, ep, edp, replicate (HSDP: dp = replicate x shard) as ints, overriding the group
        sizes. dp defaults to what the other degrees leave of the world."""
        unknown = set(degrees) - set(DEGREES)
        if unknown:
            raise ValueError(f"unknown layout keywords {sorted(unknown)}; degrees are {list(DEGREES)}")
        world, rank = world_and_rank()
        resolved = {"world": list(range(world))}
        for name, group in (groups or {}).items():
            resolved[name] = group_ranks(group)
        deg = {name: len(resolved[name]) for name in DEGREES if name in resolved}
        deg.update({k: int(v) for k, v in degrees.items() if v is not None})
        if "dp" not in deg:
            other = 1
            for name in ("sp", "cp", "tp", "pp"):
                other *= max(deg.get(name, 1), 1)
            deg["dp"] = max(world // other, 1)
            if deg["dp"] == world:
                resolved["dp"] = list(range(world))
        if default_group is None:
            default_group = "dp" if "dp" in resolved else "world"
        if deg.get("cp", 1) > 1 and not cp_kind:
            raise ValueError("cp > 1: say how the sequence is split, cp_kind='ring' or 'all-gather'")
        layout = cls(world=world, rank=rank, degrees=deg, cp_kind=cp_kind, gas=1 if gas is None else int(gas),
                     groups=resolved, rules=[], default_group=default_group, default_kind=default_kind,
                     gas_given=gas is not None)
        for pattern, fields in rules:
            layout.add_rule(pattern, **fields)
        if "ep" in resolved and not any(f.get("kind") == "EXPERT" for _, f in rules):
            layout._infer_experts()
        return layout

    def _infer_experts(self) -> None:
        """Expert parallelism declared (an "ep" group) without an EXPERT rule: expert parameters are found
        by name (EXPERT_NAMES) and reduced over their expert-data-parallel group, which, when not given, is
        the ranks at this rank's position in their own ep group (a collective: every rank attaches)."""
        if "edp" not in self.groups:
            self.groups["edp"] = same_position_ranks(self.groups["ep"], self.world, self.rank)
            self.degrees.setdefault("edp", len(self.groups["edp"]))
            self.inferred.append(f"edp group {self.groups['edp']} from every rank's ep group")
        self.add_rule(EXPERT_NAMES, kind="EXPERT", grad_group="edp")
        self.inferred.append(f"expert parameters by name ({EXPERT_NAMES}), reduced over edp")

    def add_rule(self, pattern: str, **fields) -> None:
        """Parameters whose name matches ``pattern`` (re.search) get these ParamInfo fields."""
        unknown = set(fields) - _RULE_KEYS
        if unknown:
            raise ValueError(f"rule {pattern!r}: unknown keys {sorted(unknown)}; expected {sorted(_RULE_KEYS)}")
        if fields.get("kind", "DENSE") not in KINDS:
            raise ValueError(f"rule {pattern!r}: kind {fields['kind']!r} is not one of {list(KINDS)}")
        self.rules.append((re.compile(pattern), fields))

    def param_fields(self, name: str) -> dict:
        """ParamInfo layout fields of parameter ``name``."""
        out = {"grad_group": self.default_group, "kind": self.default_kind}
        for regex, fields in self.rules:
            if regex.search(name):
                out.update(fields)
                break
        if out["kind"] == "TP_SHARD" and "shard_count" not in out:
            out["shard_count"] = self.degrees.get("tp", 0)
        return out

    def coordinate(self, name: str) -> int:
        """This rank's index in group ``name`` (0 when it is not in it)."""
        ranks = self.groups.get(name, [])
        return ranks.index(self.rank) if self.rank in ranks else 0

    def config(self) -> dict:
        """Config fields: world and the degrees (identical on every rank)."""
        d = self.degrees
        cfg = {"world": self.world, "dp": d.get("dp", 0), "sp": d.get("sp", 0), "cp": d.get("cp", 0),
               "tp": d.get("tp", 0), "pp": d.get("pp", 0), "ep_size": d.get("ep", 0), "edp": d.get("edp", 0),
               "replicate": d.get("replicate", 0), "gas": self.gas}
        if d.get("cp", 1) > 1:
            cfg["cp_kind"] = self.cp_kind
        return cfg

    def run_fields(self) -> dict:
        """RunInfo fields of this rank: coordinates and groups."""
        out = {f"{name}_rank": self.coordinate(name) for name in ("dp", "sp", "cp", "tp", "pp", "ep")}
        out["groups"] = [{"name": name, "ranks": ranks} for name, ranks in self.groups.items()]
        return out
