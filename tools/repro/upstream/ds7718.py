"""DeepSpeed #7718: under gradient accumulation, which micro-steps' gradients does the ZeRO-2 optimizer receive?
Needs torch and deepspeed only; CPU and gloo: DS_ACCELERATOR=cpu python ds7718.py [STAGE] [GAS]  (defaults 2, 4)
Two ranks, GAS micro-steps of distinct data each, the documented loop (engine.backward + engine.step per micro-step).
Prints the gradient at the boundary (safe_get_full_grad) as a multiple of the gradient of the mean loss over all
ranks and micro-steps computed in one process, and the weight each micro-step's share has in it (1 each if right).
"""
import os, sys, torch, torch.multiprocessing as mp, deepspeed, importlib

STAGE, GAS = [int(a) for a in sys.argv[1:3]] + [2, 4][len(sys.argv[1:3]):]
WORLD, B = 2, 4  # ranks, tokens per micro-batch

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 32))

def loss(m, k, ranks):  # mean loss of micro-step k over the given ranks' micro-batches (distinct data everywhere)
    gens = [torch.Generator().manual_seed(100 * k + q) for q in ranks]
    xy = [(torch.randint(0, 32, (B,), generator=g), torch.randint(0, 32, (B,), generator=g)) for g in gens]
    return sum(torch.nn.functional.cross_entropy(m(x), y) for x, y in xy) / len(xy)

def rank(r):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29518")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build used by inference
    deepspeed.init_distributed(dist_backend="gloo")
    ref, shares = model(), []
    for k in range(GAS):  # micro-step k's share of the right gradient: its mean-loss gradient over the ranks / GAS
        ref.zero_grad()
        (loss(ref, k, range(WORLD)) / GAS).backward()
        shares.append(torch.cat([q.grad.flatten() for q in ref.parameters()]))
    shares = torch.stack(shares, 1)
    right = shares.sum(1)  # the gradient of the mean loss over all ranks and micro-steps
    m = model()
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
           "zero_optimization": {"stage": STAGE}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0), config=cfg)
    for k in range(GAS):
        engine.backward(loss(engine, k, [r]))
        if k < GAS - 1:
            engine.step()  # not a boundary: counts the micro-step, no optimizer step
    got = torch.cat([deepspeed.utils.safe_get_full_grad(p).flatten() for p in m.parameters()])  # what step() uses
    factor = (got @ right) / (right @ right)
    weights = torch.linalg.lstsq(shares, got[:, None]).solution.flatten()
    if r == 0:
        print(f"ZeRO-{STAGE} gas={GAS} grad = {factor:.4f} x the all-micro-step gradient, "
              f"residual {(got - factor * right).norm() / got.norm():.4f}")
        for k, w in enumerate(weights):
            print(f"ZeRO-{STAGE} gas={GAS} micro-step {k} weight = {round(float(w), 4) + 0.0:.4f}")  # no -0.0000
    torch.distributed.destroy_process_group()  # as torch asks; not always enough (README: Exit aborts)

if __name__ == "__main__":
    mp.spawn(rank, nprocs=WORLD)
