"""PyTorch Lightning runs captured by gradtrace.lightning_adapter, for tests/python/test_lightning_adapter.py:
a two-layer MLP (4 parameters), 16 samples per optimizer step whatever the layout, SGD, CPU.

    python lightning_runs.py trainer DEVICES GAS OUT [--sum-loss] [--fsdp2]   # Trainer + gradtrace.attach(trainer, ...)
    python lightning_runs.py fabric DEVICES GAS OUT                 # Fabric + gradtrace.attach(model, ...), optimizer.step(closure)

DEVICES > 1 runs Lightning's own "ddp" strategy on gloo: Lightning starts the other ranks by running this
script again (its subprocess launcher), as it does for a user's script. Each rank takes 16 / (DEVICES x GAS)
samples per micro-batch (a DistributedSampler without shuffling: rank r takes every DEVICES-th sample), so
every layout trains on samples 16k..16k+15 in step k. Fabric: setup_dataloaders' sampler does not shuffle a
loader that does not. --sum-loss: the loss sums the per-sample losses of
the micro-batch instead of averaging them (the bug the diff must name). --fsdp2: ModelParallelStrategy, whose
configure_model shards each layer and the whole model with fully_shard over the data-parallel mesh.
--times-world: the loss multiplied by the number of processes (the accelerate report of issue 41): with dp = gas
= 2 the factor 2 fits a loss x dp and a loss not divided by gas alike.
"""

import argparse

import torch

SAMPLES_PER_STEP, STEPS = 16, 2


def dataset():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES_PER_STEP * STEPS, 8, generator=g)
    y = torch.randn(SAMPLES_PER_STEP * STEPS, 4, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


class Model(torch.nn.Module):
    """The Fabric runs' module: its parameters named as the LightningModule's (net.0.weight, ...)."""

    def __init__(self):
        super().__init__()
        self.net = net()

    def forward(self, x):
        return self.net(x)


def loss_of(out, y, sum_loss):
    per_sample = torch.nn.functional.mse_loss(out, y, reduction="none").mean(dim=1)
    return per_sample.sum() if sum_loss else per_sample.mean()


def run_trainer(devices, gas, out, sum_loss, fsdp2=False, times_world=False):
    import lightning.pytorch as pl

    import gradtrace

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return loss_of(self.net(x), y, sum_loss) * (self.trainer.world_size if times_world else 1)

        def configure_model(self):
            if fsdp2:  # ModelParallelStrategy: the model is the user's to shard (FSDP2 over the data-parallel mesh)
                from torch.distributed.fsdp import fully_shard

                mesh = self.device_mesh["data_parallel"]
                for layer in (self.net[0], self.net[2], self.net):
                    fully_shard(layer, mesh=mesh)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            # Lightning's own DistributedSampler shuffles training data (seed 0), so a DDP run would see other
            # samples per step than one device, which gradtrace-diff reports as different data: the same order.
            ds = dataset()
            sampler = torch.utils.data.DistributedSampler(ds, shuffle=False) if devices > 1 else None
            return torch.utils.data.DataLoader(ds, batch_size=SAMPLES_PER_STEP // (devices * gas), sampler=sampler)

    strategy = "ddp" if devices > 1 else "auto"
    if fsdp2:
        strategy = pl.strategies.ModelParallelStrategy(data_parallel_size=devices, tensor_parallel_size=1)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                         accumulate_grad_batches=gas, max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         use_distributed_sampler=False)
    cap = gradtrace.attach(trainer, out, loss="local-mean")  # adds its callback, closed at the end of fit
    trainer.fit(Module())
    assert cap.recorded["FINAL"] == STEPS, cap


def run_fabric(devices, gas, out):
    from lightning.fabric import Fabric

    import gradtrace

    fabric = Fabric(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto")
    fabric.launch()
    module = Model()
    model, opt = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(
        dataset(), batch_size=SAMPLES_PER_STEP // (devices * gas), shuffle=False))
    cap = gradtrace.attach(model, out, optimizer=opt, gas=gas, loss="local-mean")
    batches = list(loader)
    for step in range(STEPS):
        micro = batches[step * gas:(step + 1) * gas]
        for x, y in micro[:-1]:
            with fabric.no_backward_sync(model):
                loss = loss_of(model(x), y, False) / gas
                fabric.backward(loss)
                cap.record_step(loss)

        def closure(x=micro[-1][0], y=micro[-1][1]):
            loss = loss_of(model(x), y, False) / gas
            fabric.backward(loss)
            cap.record_step(loss)
            return loss

        opt.step(closure)  # the last micro-batch's forward and backward run inside step()
        opt.zero_grad()
    cap.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loop", choices=["trainer", "fabric"])
    ap.add_argument("devices", type=int)
    ap.add_argument("gas", type=int)
    ap.add_argument("out")
    ap.add_argument("--sum-loss", action="store_true")
    ap.add_argument("--fsdp2", action="store_true", help="trainer: ModelParallelStrategy with fully_shard")
    ap.add_argument("--times-world", action="store_true", help="trainer: the loss x the number of processes (a bug)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.loop == "trainer":
        run_trainer(a.devices, a.gas, a.out, a.sum_loss, a.fsdp2, a.times_world)
    else:
        run_fabric(a.devices, a.gas, a.out)


if __name__ == "__main__":
    main()
