"""A Megatron-DeepSpeed parallel_state-style mpu for Ulysses SP x DP, tensor/pipeline parallel 1.

DeepSpeed applies its sequence-parallel divisor only when `deepspeed.initialize(..., mpu=...)` gets an
object exposing these groups (deepspeed/utils/groups.py: _get_sequence_parallel_world_size reads
mpu.get_sequence_parallel_world_size; the ZeRO optimizer's dp_process_group is
mpu.get_sequence_data_parallel_group()). Layout as in Megatron-DeepSpeed and gradtrace-train: SP groups
are consecutive ranks, DP groups strided, the sequence-data-parallel group is all dp x sp ranks.

It deliberately has no `initialize_sequence_parallel` attribute: DeepSpeed treats an mpu that has one
as its own slim deepspeed.runtime.sequence_parallel.parallel_state_sp (and then ignores the data- and
model-parallel getters).
"""

import torch.distributed as tdist


class UlyssesMPU:

    def __init__(self, sp: int, dp: int):
        world, rank = tdist.get_world_size(), tdist.get_rank()
        if world != sp * dp:
            raise ValueError(f"world size {world} != sp ({sp}) x dp ({dp})")
        self.sp, self.dp, self.rank = sp, dp, rank
        self.sp_rank, self.dp_rank = rank % sp, rank // sp
        # Every rank must create every group, in the same order.
        for d in range(dp):
            g = tdist.new_group(list(range(d * sp, (d + 1) * sp)))
            if d == self.dp_rank:
                self._sp_group, self._sp_ranks = g, list(range(d * sp, (d + 1) * sp))
        for s in range(sp):
            g = tdist.new_group(list(range(s, world, sp)))
            if s == self.sp_rank:
                self._dp_group, self._dp_ranks = g, list(range(s, world, sp))
        for r in range(world):  # tensor (= model) parallel size 1: a group of one per rank
            g = tdist.new_group([r])
            if r == rank:
                self._mp_group = g
        self._sdp_group = tdist.new_group(list(range(world)))
        self._sdp_ranks = list(range(world))

    # sequence parallel
    def get_sequence_parallel_group(self):
        return self._sp_group

    def get_sequence_parallel_world_size(self):
        return self.sp

    def get_sequence_parallel_rank(self):
        return self.sp_rank

    # sequence-data parallel: what ZeRO partitions over and reduces gradients across
    def get_sequence_data_parallel_group(self):
        return self._sdp_group

    def get_sequence_data_parallel_world_size(self):
        return self.sp * self.dp

    def get_sequence_data_parallel_rank(self):
        return self.rank

    # pure data parallel (batch size bookkeeping)
    def get_data_parallel_group(self):
        return self._dp_group

    def get_data_parallel_world_size(self):
        return self.dp

    def get_data_parallel_rank(self):
        return self.dp_rank

    def get_data_parallel_group_ranks(self):
        return list(self._dp_ranks)

    # model = tensor parallel, size 1
    def get_model_parallel_group(self):
        return self._mp_group

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0

    get_tensor_model_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_rank = get_model_parallel_rank

    def get_tensor_model_parallel_src_rank(self):
        return self.rank

    def get_pipeline_model_parallel_group(self):
        return self._mp_group

    def get_pipeline_model_parallel_world_size(self):
        return 1

    def get_pipeline_model_parallel_rank(self):
        return 0
