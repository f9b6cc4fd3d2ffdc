"""A gradtrace-versions script (its contract: gradtrace/versions/command.py) whose gradient goes through two
torchmetrics image metrics, each training a 3x3 convolution of its own: ERGAS (`ergas.*`) and SSIM (`ssim.*`),
one SGD step, float64, seeded.

Measured over torchmetrics 1.0.0-1.6.0 (tests/python/test_versions_command.py, `--transitions`): the gradients
change twice, at 1.4.0 (the ERGAS convolution's gradient is 1/16 of 1.3.2's: "Fixed bug in computation of
`ERGAS` metric (#2498)", its CHANGELOG) and at 1.4.2 (the SSIM convolution's gradient differs from 1.4.1's, not
by a factor; the changelog entry behind it was not looked up). Every other release gives the same gradients as
the one before it, to ~1e-14.
"""

import os

import torch
from torchmetrics.functional import error_relative_global_dimensionless_synthesis as ergas
from torchmetrics.functional import structural_similarity_index_measure as ssim

import gradtrace

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
g = torch.Generator().manual_seed(1)
clean = torch.rand(2, 3, 32, 32, generator=g) + 0.1
noisy = clean + 0.2 * torch.rand(2, 3, 32, 32, generator=g)
model = torch.nn.ModuleDict({"ergas": torch.nn.Conv2d(3, 3, 3, padding=1), "ssim": torch.nn.Conv2d(3, 3, 3, padding=1)})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cap = gradtrace.attach(model, os.environ["GRADTRACE_OUT_DIR"], optimizer=opt,
                       loss_description="ergas(ergas conv) / 10 + 1 - ssim(ssim conv, data_range=1.5)")
loss = (ergas(noisy + 0.1 * model["ergas"](noisy), clean) / 10
        + 1 - ssim(noisy + 0.1 * model["ssim"](noisy), clean, data_range=1.5))
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
