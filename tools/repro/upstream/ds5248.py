"""DeepSpeed #5248: under Ulysses SP, what gradient does the optimizer get from backward(loss) and backward(loss/sp)?
Needs torch and deepspeed only; CPU and gloo: DS_ACCELERATOR=cpu python ds5248.py [STAGE] [SP]  (defaults 2, 2)
Each SP rank holds 1/sp of the sequence and its mean loss; the model is token-wise, so no attention is needed.
Prints grad / (full-sequence mean-loss grad), per loss: summed SP ranks give sp and 1, averaged ones 1 and 1/sp.
"""
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp, deepspeed, importlib

STAGE, SP = (int(a) for a in (sys.argv[1:] + ["2", "2"])[:2])
T = 8 * SP  # tokens in the sequence

class MPU:  # Megatron-DeepSpeed's getters, dp 1: one SP group of every rank (the sequence-data-parallel group)
    def __init__(s): s.own = [dist.new_group([r]) for r in range(SP)][dist.get_rank()]
    get_sequence_parallel_group = get_sequence_data_parallel_group = lambda s: dist.group.WORLD
    get_sequence_parallel_world_size = get_sequence_data_parallel_world_size = lambda s: SP
    get_sequence_parallel_rank = get_sequence_data_parallel_rank = lambda s: dist.get_rank()
    get_data_parallel_group = get_model_parallel_group = get_pipeline_model_parallel_group = lambda s: s.own
    get_data_parallel_world_size = get_model_parallel_world_size = get_pipeline_model_parallel_world_size = lambda s: 1
    get_data_parallel_rank = get_model_parallel_rank = get_pipeline_model_parallel_rank = lambda s: 0
    get_tensor_model_parallel_group, get_tensor_model_parallel_world_size, get_tensor_model_parallel_rank = (
        get_model_parallel_group, get_model_parallel_world_size, get_model_parallel_rank)

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 32))

def rank(r):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(SP), MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build used by inference
    deepspeed.init_distributed(dist_backend="gloo")
    x, y = torch.arange(T) % 32, (torch.arange(T) * 7 + 3) % 32
    ref = model()
    torch.nn.functional.cross_entropy(ref(x), y).backward()  # the full-sequence mean loss, one process
    mine = slice(r * T // SP, (r + 1) * T // SP)
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": STAGE},
           "zero_allow_untested_optimizer": True}
    for name, div in (("backward(loss)", 1), ("backward(loss / sp)", SP)):
        m = model()
        if STAGE == 3:  # partition over the SP ranks, as Megatron-DeepSpeed does (else each rank is its own dp group)
            deepspeed.zero.Init(module=m, data_parallel_group=dist.group.WORLD, config_dict_or_path=cfg)
        engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0), config=cfg,
                                          mpu=MPU())
        engine.backward(torch.nn.functional.cross_entropy(engine(x[mine]), y[mine]) / div)
        for (pn, p), q in zip(m.named_parameters(), ref.parameters()):
            factor = (deepspeed.utils.safe_get_full_grad(p) * q.grad).sum() / (q.grad * q.grad).sum()
            if r == 0:
                print(f"ZeRO-{STAGE} sp={SP} {name:20s} {pn:8s} grad = {factor:.4f} x full-sequence")
    torch.distributed.destroy_process_group()  # as torch asks; not always enough (README: Exit aborts)

if __name__ == "__main__":
    mp.spawn(rank, nprocs=SP)
