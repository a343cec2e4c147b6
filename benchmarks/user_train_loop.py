"""A user's own training script, as a team would have it (not gpuvs's workload), which gpuvs reads as a command.

    python3 benchmarks/user_train_loop.py MODEL BATCH [amp] [steps=N] [warmup=N] [size=PIXELS] [device=cuda|cpu]
The plain PyTorch loop of a recipe, with a printed rate after every step (benchmarks/command_gpu.sh reads it).
Like the recipe, it waits for the GPU after every step, which costs about 2% on an H100."""
import json
import os
import statistics
import sys
import time

import torch
import torchvision

model, bs = sys.argv[1], int(sys.argv[2])
opts = dict(a.split("=", 1) for a in sys.argv[3:] if "=" in a)
amp = "amp" in sys.argv
steps, warmup = int(opts.get("steps", 60)), int(opts.get("warmup", 15))
size, device = int(opts.get("size", 224)), opts.get("device", "cuda")
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
m = getattr(torchvision.models, model)(num_classes=1000).to(device).to(memory_format=torch.channels_last)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(bs, 3, size, size, device=device).to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (bs,), device=device)


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    opt.step()


t_start = time.perf_counter()
for _ in range(warmup):
    step()
sync()
t_first = time.perf_counter() - t_start
ts = []
for i in range(steps):
    t0 = time.perf_counter()
    step()
    sync()
    ts.append(time.perf_counter() - t0)
    print(f"step {i + 1}: {bs / ts[-1]:.1f} images/sec", flush=True)
ips = [bs / t for t in ts]
med = statistics.median(ips)
print(json.dumps(dict(model=model, bs=bs, amp=amp, device=device, pid=os.getpid(), warm_s=round(t_first, 2),
                      mean=round(statistics.mean(ips), 1), jitter=round(1.4826 * statistics.median(abs(v - med) for v in ips), 1),
                      total=round(bs * steps / sum(ts), 1))), flush=True)
