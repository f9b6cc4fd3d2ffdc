"""A gradtrace-versions script (its contract: gradtrace/versions/command.py) whose gradient goes through
torchmetrics: one SGD step of a per-band linear map trained to minimise ERGAS
(torchmetrics.functional.error_relative_global_dimensionless_synthesis, ratio 4, its default).

torchmetrics 1.4.0 fixed ERGAS (CHANGELOG.md, [1.4.0] - 2024-05-03, Fixed: "Fixed bug in computation of
`ERGAS` metric (#2498)"): `100 * ratio * sqrt(...)` became `100 / ratio * sqrt(...)`
(functional/image/ergas.py), so the metric, and every gradient through it, is ratio**2 = 16 times smaller
from 1.4.0 on. Same weights and data in every release (seeded).
"""

import os

import torch
from torchmetrics.functional import error_relative_global_dimensionless_synthesis as ergas

import gradtrace

torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
target = 0.5 + torch.rand(2, 3, 16, 16, generator=g)
observed = target + 0.1 * torch.randn(2, 3, 16, 16, generator=g)
model = torch.nn.Conv2d(3, 3, 1)  # a per-band linear correction
opt = torch.optim.SGD(model.parameters(), lr=0.01)
cap = gradtrace.attach(model, os.environ["GRADTRACE_OUT_DIR"], optimizer=opt,
                       loss_description="torchmetrics ERGAS (ratio 4)")
loss = ergas(model(observed), target)
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
