"""DeepSpeed #7749: with gradient accumulation, is the gradient divided by gas once, or by gas per output tensor?
Needs torch and deepspeed only; CPU and gloo: DS_ACCELERATOR=cpu python ds7749.py [STAGE] [GAS]  (defaults 2, 4)
Two ranks, GAS micro-steps of distinct data; the model returns its logits, its loss, or both in a dict (as Hugging
Face models do); each is trained with engine.backward(loss) and as Trainer does, backward(loss / gas,
scale_wrt_gas=False). Prints the gradient at the boundary (safe_get_full_grad) as a multiple of the gradient of the
mean loss over all ranks and micro-steps computed in one process (residual 0: every parameter has that factor).
"""
import os, sys, torch, torch.multiprocessing as mp, deepspeed, importlib
from torch.nn.functional import cross_entropy

STAGE, GAS = [int(a) for a in sys.argv[1:3]] + [2, 4][len(sys.argv[1:3]):]
WORLD, B = 2, 4  # ranks, tokens per micro-batch

class Net(torch.nn.Module):
    def __init__(s, out="logits"):
        super().__init__()
        torch.manual_seed(0)
        s.out, s.net = out, torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 32))
    def forward(s, x, y):
        logits = s.net(x)
        loss = cross_entropy(logits, y)
        return {"logits": logits, "loss": loss, "dict": {"loss": loss, "logits": logits}}[s.out]

def batch(k, q):  # micro-step k, rank q: distinct tokens and targets everywhere
    g = torch.Generator().manual_seed(100 * k + q)
    return torch.randint(0, 32, (B,), generator=g), torch.randint(0, 32, (B,), generator=g)

def rank(r):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29519")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build used by inference
    deepspeed.init_distributed(dist_backend="gloo")
    ref = Net()
    (sum(cross_entropy(ref(*batch(k, q)), batch(k, q)[1]) for k in range(GAS) for q in range(WORLD))
     / (GAS * WORLD)).backward()  # the mean loss over all ranks and micro-steps, one process
    right = torch.cat([p.grad.flatten() for p in ref.parameters()])
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": GAS,
           "zero_optimization": {"stage": STAGE}, "zero_allow_untested_optimizer": True}
    for out in ("logits", "loss", "dict"):
        for name, div, wrt in (("backward(loss)", 1, True), ("backward(loss / gas, scale_wrt_gas=False)", GAS, False)):
            m = Net(out)
            engine, *_ = deepspeed.initialize(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0), config=cfg)
            for k in range(GAS):
                x, y = batch(k, r)
                o = engine(x, y)
                loss = cross_entropy(o, y) if out == "logits" else o["loss"] if out == "dict" else o
                engine.backward(loss / div, scale_wrt_gas=wrt)
                if k < GAS - 1:
                    engine.step()  # not a boundary: counts the micro-step, no optimizer step
            got = torch.cat([deepspeed.utils.safe_get_full_grad(p).flatten() for p in m.parameters()])
            factor = (got @ right) / (right @ right)
            if r == 0:
                print(f"ZeRO-{STAGE} gas={GAS} returns {out:6s} {name:42s} grad = {factor:.4f} x the all-micro-step "
                      f"gradient, residual {(got - factor * right).norm() / got.norm():.4f}")
    torch.distributed.destroy_process_group()  # as torch asks; not always enough (README: Exit aborts)

if __name__ == "__main__":
    mp.spawn(rank, nprocs=WORLD)
