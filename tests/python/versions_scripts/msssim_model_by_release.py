"""A gradtrace-versions script whose model depends on the release it runs under: a 3x3 convolution under
pytorch-msssim 0.1.x, a 5x5 one from 0.2.0 on. Two releases of different generations give traces of
different models, which gradtrace-diff refuses ("model fingerprint ... differs"): the version command must
report such a pair as not compared, never as the release that changed the gradients (issue 41).
"""

import os

import pytorch_msssim
import torch
from pytorch_msssim import ssim

import gradtrace

kernel = 3 if pytorch_msssim.__version__.startswith("0.1.") else 5
torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
g = torch.Generator().manual_seed(1)
clean = torch.rand(2, 1, 32, 32, generator=g)
noisy = (clean + 0.2 * torch.rand(2, 1, 32, 32, generator=g)).clamp(0, 1)
model = torch.nn.Conv2d(1, 1, kernel, padding=kernel // 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cap = gradtrace.manual_adapter.attach(model, os.environ["GRADTRACE_OUT_DIR"], optimizer=opt,
                                      loss_description="1 - pytorch_msssim.ssim(data_range=1)")
loss = 1 - ssim(noisy + 0.1 * model(noisy), clean, data_range=1.0, win_size=7)
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
