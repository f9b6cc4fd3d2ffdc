"""A gradtrace-versions script (its contract: gradtrace/versions/command.py) whose gradient goes through
pytorch-msssim: one SGD step of a 3x3 denoising convolution trained with the MS-SSIM loss, 1 - ms_ssim.

pytorch-msssim 0.2.0 changed how MS-SSIM is computed (its README, "Updates", 2020.04.30 (v0.2): "ssim &
ms-ssim are calculated in the same way as tensorflow and skimage"; commit 0180eae): the loss and so the
convolution's gradient differ from 0.1.5's. Plain SSIM did not change (measured: 0.1.1 to 1.0.0 give the
same value and gradient), so this script uses ms_ssim. float64, so that releases that compute the same
thing agree to ~1e-14 and only a changed computation is a difference. Same weights and data in every
release (seeded).
"""

import os

import torch
from pytorch_msssim import ms_ssim

import gradtrace

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
g = torch.Generator().manual_seed(1)
clean = torch.rand(2, 1, 176, 176, generator=g)  # ms_ssim's 5 scales need a side > 160
noisy = (clean + 0.2 * torch.rand(2, 1, 176, 176, generator=g)).clamp(0, 1)
model = torch.nn.Conv2d(1, 1, 3, padding=1)  # a residual correction: the output stays near the image
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cap = gradtrace.attach(model, os.environ["GRADTRACE_OUT_DIR"], optimizer=opt,
                       loss_description="1 - pytorch_msssim.ms_ssim(data_range=1)")
loss = 1 - ms_ssim(noisy + 0.1 * model(noisy), clean, data_range=1.0)
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
