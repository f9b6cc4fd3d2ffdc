"""A gradtrace-versions script whose model depends on the release it runs under: one 3x3 convolution under
pytorch-msssim 0.1.x, two from 0.2.0 on (parameters "weight", "bias" against "0.weight", ..., "1.bias"). Two
releases of different generations give traces of different models, which gradtrace-diff refuses ("model
fingerprint ... differs ... (different models)"): the version command must report such a pair as not
compared, never as the release that changed the gradients (issue 41).
"""

import os

import torch
from pytorch_msssim import ssim

import gradtrace

old = os.environ["GRADTRACE_RELEASE"].startswith("0.1.")  # the release under test (the script contract)
torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
g = torch.Generator().manual_seed(1)
clean = torch.rand(2, 1, 32, 32, generator=g)
noisy = (clean + 0.2 * torch.rand(2, 1, 32, 32, generator=g)).clamp(0, 1)
conv = lambda: torch.nn.Conv2d(1, 1, 3, padding=1)  # noqa: E731
model = conv() if old else torch.nn.Sequential(conv(), conv())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
cap = gradtrace.attach(model, os.environ["GRADTRACE_OUT_DIR"], optimizer=opt,
                       loss_description="1 - pytorch_msssim.ssim(data_range=1)")
loss = 1 - ssim(noisy + 0.1 * model(noisy), clean, data_range=1.0, win_size=7)
loss.backward()
cap.record_step(loss)
opt.step()
cap.close()
