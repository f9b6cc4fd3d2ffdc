"""One process that hits a write error in its own capture, for test_capture_errors.py (issue 20).

    python write_error_in_process.py warn|raise DIR

RLIMIT_FSIZE applies to every file a process writes, so it is set here, in a process of its own whose
stdout and stderr are pipes, never in pytest's (whose terminal may be a log file larger than the limit:
CI's was). CPython ignores SIGXFSZ, so a write past the limit fails with EFBIG ("File too large").

warn: DIR/a is captured with the default on_error="warn" under a 40,000-byte limit, closed twice;
      DIR/b is captured for 2 steps, then the limit is set to its size and the adapter is dropped
      unclosed (the finalizer must close it without a word). Prints one JSON line:
      {"disabled": message, "final": FINAL buckets recorded in a, "b_size": size of b at the limit}.
raise: DIR is captured with on_error="raise" under a 40,000-byte limit. Prints one JSON line:
      {"train_error": the TraceError of training, "close_error": that of close()}.
"""

import gc
import json
import os
import resource
import sys

import torch

import gradtrace


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def train(cap, model, opt, steps):
    for step in range(steps):
        loss = model(torch.randn(4, 32, generator=torch.Generator().manual_seed(step))).pow(2).mean()
        loss.backward()
        cap.record_step(loss, 4)
        opt.step()
        opt.zero_grad()


def limit_file_size(n):
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def attach(model, out, **kwargs):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return gradtrace.attach(model, out, optimizer=opt, **kwargs), opt


def warn(out):
    model = tiny_model()
    cap, opt = attach(model, os.path.join(out, "a"), run_id="a")
    limit_file_size(40_000)
    train(cap, model, opt, 6)
    result = {"disabled": cap.recorder.disabled, "final": cap.recorder.recorded["FINAL"]}
    cap.close()
    cap.close()
    limit_file_size(resource.RLIM_INFINITY)

    model = tiny_model()
    cap, opt = attach(model, os.path.join(out, "b"), run_id="b")
    train(cap, model, opt, 2)
    result["b_size"] = os.path.getsize(os.path.join(out, "b", "rank-00000.gtrace"))
    limit_file_size(result["b_size"])
    del cap, model, opt
    gc.collect()
    return result


def raise_(out):
    model = tiny_model()
    cap, opt = attach(model, out, run_id="r", on_error="raise")
    limit_file_size(40_000)
    result = {}
    try:
        train(cap, model, opt, 6)
    except gradtrace.TraceError as e:
        result["train_error"] = str(e)
    try:
        cap.close()
    except gradtrace.TraceError as e:
        result["close_error"] = str(e)
    return result


if __name__ == "__main__":
    mode, out = sys.argv[1:]
    print(json.dumps({"warn": warn, "raise": raise_}[mode](out)), flush=True)
