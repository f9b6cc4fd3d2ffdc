"""DTensor parameters and gradients (``torch.distributed.tensor``): what a rank holds of them, as
slices of the flattened global parameter, and the parallel layout their DeviceMesh and placements
imply. Every adapter goes through here (the RankRecorder for FINAL, ``make_layout`` for the layout).

Pieces. A DTensor's local tensor is a block of the global (full) tensor: along each tensor dim, the
global indices DTensor's own placement logic gives this rank (``compute_local_shape_and_global_offset``:
Shard(d) on any number of mesh dims, uneven shards included; for ``_StridedShard``, FSDP2 x TP's
right-to-left sharding, the indices DTensor's own split produces). The block is written as one
slice per contiguous run of the flattened global parameter: one slice for a dim-0 shard, one per
row of the leading dims for a shard along a later dim. The diff (``gradtrace-diff``) joins the
ranks' slices by offset; overlapping slices (Replicate dims) are compared as replicas.

Partial gradients (``Partial(sum)``, e.g. a norm's weight under ``SequenceParallel``, whose every
tp rank holds its tokens' share) are never written as replicas: FINAL reduces them first with
``redistribute`` (Partial mesh dims to Replicate, Shard dims kept), an all-reduce over those mesh
dims that every rank runs, in parameter order, inside FINAL. PRE/POST records of the manual
adapter write what the rank holds (the local partial value), since a PRE_REDUCE is summed over its
group by the diff anyway.

Layout. Each mesh dim is a process group, named after a group the adapter already knows with the
same ranks (FSDP2's ``dp``/``shard``/``replicate``, ``groups=``), else the mesh dim's name, else
``tp`` (then ``mesh_dim<i>``). Dims named as data-parallel groups (``dp``, ``shard``, ``replicate``,
``dp_shard``, ``dp_replicate``, ``fsdp``, ``hsdp``, ``ddp``) shard or replicate for data
parallelism; the others are model parallel. A parameter sharded along tensor dim d on a model-
parallel mesh dim is ``TP_SHARD`` with ``partition_dim`` d, ``shard_count`` the product of the
sizes of the mesh dims sharding d, ``grad_group`` the data-parallel group (FSDP's, or the layout's
default ``dp``); one only replicated over model-parallel dims is ``REPLICATED`` with
``grad_group`` the first such dim's group (``tp``). A mesh of only model-parallel dims covering the
world (plain TP) adds the group ``dp`` = [this rank] (dp degree 1).
"""

from __future__ import annotations

import math
import re

__all__ = ["is_dtensor", "param_spec", "local_index", "block_pieces", "dtensor_pieces", "mesh_layout",
           "DATA_PARALLEL_NAMES"]

DATA_PARALLEL_NAMES = frozenset({"dp", "shard", "replicate", "dp_shard", "dp_replicate", "fsdp", "hsdp", "ddp"})


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor (False on a torch without torch.distributed)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without torch.distributed
        return False
    return isinstance(t, DTensor)


def param_spec(p):
    """(global shape, mesh, placements) of a DTensor parameter, or of a plain parameter that stands
    for one: DDP x TP (``DistributedDataParallel(model, device_mesh=...)``) swaps each DTensor
    parameter for its local tensor with the DTensorSpec in ``_st_info``
    (torch.distributed.tensor.parallel.ddp). None for any other parameter."""
    if is_dtensor(p):
        return tuple(int(n) for n in p.shape), p.device_mesh, tuple(p.placements)
    spec = getattr(p, "_st_info", None)
    if spec is not None and hasattr(spec, "mesh") and hasattr(spec, "placements") and hasattr(spec, "shape"):
        return tuple(int(n) for n in spec.shape), spec.mesh, tuple(spec.placements)
    return None


def _strided_shard_class():
    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:
        return None
    return _StridedShard


def shard_dim(placement):
    """The tensor dim a Shard or _StridedShard placement splits, else None."""
    from torch.distributed.tensor import Shard

    strided = _strided_shard_class()
    if isinstance(placement, Shard) or (strided is not None and isinstance(placement, strided)):
        return int(placement.dim)
    return None


def local_index(global_shape, mesh, placements):
    """(local shape, index): per tensor dim, the global indices this rank's local tensor holds, in
    local order (a ``range``; a list where a ``_StridedShard`` leaves gaps). From DTensor's own
    ``compute_local_shape_and_global_offset``; ``_StridedShard`` dims from DTensor's own split of an
    index vector (``distribute_tensor(..., src_data_rank=None)``: no communication)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    global_shape = tuple(int(s) for s in global_shape)
    local_shape, offset = compute_local_shape_and_global_offset(global_shape, mesh, placements)
    local_shape = tuple(int(s) for s in local_shape)
    index = [range(int(o), int(o) + n) for o, n in zip(offset, local_shape)]
    strided = _strided_shard_class()
    if strided is not None:
        for d in sorted({int(p.dim) for p in placements if isinstance(p, strided)}):
            index[d] = _strided_indices(global_shape[d], d, mesh, placements)
            if len(index[d]) != local_shape[d]:
                raise ValueError(f"gradtrace: DTensor {list(placements)}: {len(index[d])} indices along dim {d}, "
                                 f"the local shape has {local_shape[d]}")
    return local_shape, index


def _strided_indices(size: int, dim: int, mesh, placements) -> list[int]:
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    strided = _strided_shard_class()
    one_d = []
    for p in placements:
        if isinstance(p, strided) and p.dim == dim:
            one_d.append(strided(0, split_factor=p.split_factor))
        elif isinstance(p, Shard) and p.dim == dim:
            one_d.append(Shard(0))
        else:
            one_d.append(Replicate())
    ids = torch.arange(size, dtype=torch.int64, device=mesh.device_type)
    local = distribute_tensor(ids, mesh, one_d, src_data_rank=None).to_local()
    return [int(i) for i in local.cpu().tolist()]


def _runs(index) -> list[tuple[int, int, int]]:
    """(first global index, first local index, length) of each run of consecutive global indices."""
    if isinstance(index, range):
        return [(index.start, 0, len(index))] if len(index) else []
    out = []
    for k, g in enumerate(index):
        if out and out[-1][0] + out[-1][2] == g:
            first, local, n = out[-1]
            out[-1] = (first, local, n + 1)
        else:
            out.append((g, k, 1))
    return out


def block_runs(global_shape, index) -> list[tuple[int, int, int]]:
    """The block of the global tensor ``index`` selects (per dim, global indices in local order), as
    (global element offset, local element offset, count) runs, both row-major: the trailing dims
    that hold every index in order fold into the run length, so a dim-0 shard is one run and a shard
    along dim d > 0 one run per row of dims < d."""
    shape = [int(s) for s in global_shape]
    n = len(shape)
    if n == 0:
        return [(0, 0, 1)]
    local = [len(ix) for ix in index]
    if any(s == 0 for s in local):
        return []
    k = n - 1  # the innermost dim that does not hold all of its indices in order
    while k > 0 and isinstance(index[k], range) and index[k] == range(shape[k]):
        k -= 1
    inner = math.prod(shape[k + 1:])
    gstride = [math.prod(shape[d + 1:]) for d in range(n)]
    lstride = [math.prod(local[d + 1:]) for d in range(n)]
    runs = _runs(index[k])
    out = []
    bases = [(0, 0)]
    for d in range(k):  # the Cartesian product of the leading dims' indices, in local (row-major) order
        bases = [(g0 + g * gstride[d], l0 + j * lstride[d]) for g0, l0 in bases for j, g in enumerate(index[d])]
    for g0, l0 in bases:
        for g, j, length in runs:
            out.append((g0 + g * gstride[k], l0 + j * lstride[k], length * inner))
    return out


def block_pieces(pid: int, values, global_shape, index) -> list:
    """(param id, element offset, tensor) pieces of ``values``, the block ``index`` selects of a
    parameter of ``global_shape`` (per dim, the global indices ``values`` holds, in order)."""
    local = tuple(len(ix) for ix in index)
    if tuple(values.shape) != local:
        if values.numel() != math.prod(local):
            raise ValueError(f"gradtrace: a piece of shape {tuple(values.shape)} for a block of shape {local}")
        values = values.reshape(local)
    flat = values.detach().reshape(-1)
    return [(pid, g, flat[j:j + n]) for g, j, n in block_runs(global_shape, index)]


def _plain(t):
    """A plain tensor from a DTensor's local tensor (an async collective's result is waited for)."""
    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:
        AsyncCollectiveTensor = ()
    if AsyncCollectiveTensor and isinstance(t, AsyncCollectiveTensor):
        t = t.wait()
    return t.detach()


def reduce_partial(grad):
    """``grad`` with every Partial mesh dim reduced (redistributed to Replicate; Shard dims kept): a
    collective over those mesh dims. A DTensor without Partial placements is returned as it is."""
    from torch.distributed.tensor import Replicate

    if not any(p.is_partial() for p in grad.placements):
        return grad
    return grad.redistribute(grad.device_mesh, [Replicate() if p.is_partial() else p for p in grad.placements])


def dtensor_pieces(pid: int, grad, *, reduce: bool = True) -> list:
    """(param id, element offset, tensor) pieces of a DTensor ``grad``: this rank's local tensor at
    its offsets in the flattened global tensor. ``reduce``: Partial placements are reduced first (a
    collective every rank of those mesh dims must run); else the local (partial) values are written."""
    if reduce:
        grad = reduce_partial(grad)
    local = _plain(grad.to_local())
    local_shape, index = local_index(grad.shape, grad.device_mesh, grad.placements)
    if tuple(local.shape) != local_shape:
        if len(local.shape) == len(local_shape) and all(a >= b for a, b in zip(local.shape, local_shape)):
            local = local[tuple(slice(0, n) for n in local_shape)]  # a padded local tensor
        else:
            raise ValueError(f"gradtrace: a DTensor {tuple(grad.shape)} {list(grad.placements)} has a local tensor "
                             f"of shape {tuple(local.shape)}; its placements give {local_shape}")
    return block_pieces(pid, local, grad.shape, index)


# ---- layout -------------------------------------------------------------------------------------

def _mesh_dim_ranks(mesh, dim: int) -> list[int] | None:
    """Global ranks of this rank's group along mesh dim ``dim`` (None: this rank is not in the mesh)."""
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    at = list(coord)
    at[dim] = slice(None)
    return [int(r) for r in mesh.mesh[tuple(at)].reshape(-1).tolist()]


def mesh_layout(named_params, known: dict | None = None, world: int = 1, rank: int = 0):
    """The layout DTensor parameters imply. ``known``: name -> global ranks of the groups the adapter
    already has (a mesh dim with the same ranks takes that name). Returns ``(groups, rules)``:
    name -> ranks of every mesh dim (and ``dp`` = [rank] for a plain-TP mesh covering the world), and
    ``[(pattern, fields)]`` per DTensor parameter (``grad_group`` None: the layout's default group)."""
    known = {k: list(v) for k, v in (known or {}).items() if k != "world"}
    groups: dict = {}
    names: dict = {}  # (mesh id, dim) -> name
    rules = []
    data_dims_seen = False
    covers_world = False
    for name, p in named_params:
        spec = param_spec(p) if getattr(p, "requires_grad", False) else None
        if spec is None:
            continue
        _, mesh, placements = spec
        dims = []
        for i in range(mesh.ndim):
            key = (id(mesh), i)
            if key not in names:
                ranks = _mesh_dim_ranks(mesh, i)
                if ranks is None:
                    break
                names[key] = _name_for(ranks, (mesh.mesh_dim_names or [None] * mesh.ndim)[i], known, groups)
                groups.setdefault(names[key], ranks)
            dims.append(names[key])
        else:
            if math.prod(mesh.shape) == world:
                covers_world = True
            data = [i for i, n in enumerate(dims) if n in DATA_PARALLEL_NAMES]
            data_dims_seen = data_dims_seen or bool(data)
            model = [i for i in range(mesh.ndim) if i not in data]
            sharded = [(i, shard_dim(placements[i])) for i in model if shard_dim(placements[i]) is not None]
            fields = None
            if sharded:
                pdim = sharded[0][1]
                fields = {"kind": "TP_SHARD", "partition_dim": pdim,
                          "shard_count": math.prod(mesh.size(i) for i, d in sharded if d == pdim),
                          "grad_group": _data_group(data, dims, placements)}
            elif model:
                fields = {"kind": "REPLICATED", "grad_group": dims[model[0]]}
            if fields is not None:
                rules.append((f"^{re.escape(name)}$", fields))
    if groups and not data_dims_seen and covers_world and "dp" not in known and "dp" not in groups:
        groups["dp"] = [rank]
    return groups, rules


def _name_for(ranks, mesh_name, known: dict, taken: dict) -> str:
    for name, r in known.items():
        if r == ranks:
            return name
    base = mesh_name or "tp"
    candidate, k = base, 0
    while (candidate in known and known[candidate] != ranks) or (candidate in taken and taken[candidate] != ranks):
        k += 1
        candidate = f"{base}{k}" if mesh_name else f"mesh_dim{k}"
    return candidate


def _data_group(data, dims, placements):
    """The data-parallel group reducing a parameter: its data-parallel mesh dim that shards it (FSDP's),
    else its last data-parallel dim, else None (the layout's default group)."""
    if not data:
        return None
    for i in reversed(data):
        if shard_dim(placements[i]) is not None:
            return dims[i]
    return dims[data[-1]]
