"""DeepSpeed PipelineEngine with gradient accumulation (#7773, #8152): is each stage's gradient the mean over the
micro-batches? Needs torch and deepspeed only; CPU and gloo: DS_ACCELERATOR=cpu python ds_pipe.py [GAS]  (default 4)
Two ranks are two pipeline stages of a 3-linear-layer model (stage 0: layers 0-2, stage 1: layer 4); one optimizer
step of GAS micro-batches of 4 samples, trained with engine.train_batch. Prints, per parameter and stage, the
gradient the optimizer receives as a multiple of the gradient of the mean loss over all GAS x 4 samples computed
in one process (residual 0: every element has that factor). No gradtrace: the numbers gradtrace-versions reports
are held against these (tools/repro/ds_pipe/README.md).
"""
import importlib, os, sys, torch, torch.multiprocessing as mp, deepspeed
from deepspeed.pipe import PipelineModule
from torch.nn.functional import cross_entropy

GAS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
MB, STAGES = 4, 2

def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)]

def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(GAS * MB, 8, generator=g), torch.randint(0, 4, (GAS * MB,), generator=g)

def rank(r):
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(STAGES), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29543")
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build used by inference
    deepspeed.init_distributed(dist_backend="gloo")
    x, y = data()
    ref = torch.nn.Sequential(*layers())
    cross_entropy(ref(x), y).backward()  # the mean over all samples, one process
    net = PipelineModule(layers=layers(), num_stages=STAGES, loss_fn=cross_entropy, partition_method="uniform")
    cfg = {"train_micro_batch_size_per_gpu": MB, "gradient_accumulation_steps": GAS, "steps_per_print": 10 ** 6}
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    engine, *_ = deepspeed.initialize(model=net, optimizer=opt, config=cfg)
    seen = {}
    opt.register_step_pre_hook(lambda *_: seen.update({n: p.grad.clone() for n, p in net.named_parameters()}))
    engine.train_batch(data_iter=iter([(x[k * MB:(k + 1) * MB], y[k * MB:(k + 1) * MB]) for k in range(GAS)]))
    want = dict(ref.named_parameters())
    for name, got in seen.items():
        a, b = want[name].grad.flatten(), got.flatten()
        factor = float(a @ b / (a @ a))
        print(f"deepspeed {deepspeed.__version__} gas={GAS} stage {engine.stage_id} {name:9s} grad = {factor:.4f} x the "
              f"one-process gradient, residual {float((b - factor * a).norm() / b.norm()):.4f}", flush=True)
    torch.distributed.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank, nprocs=STAGES)
