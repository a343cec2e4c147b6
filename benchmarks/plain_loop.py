"""Reference: the plainest PyTorch loop of a torchvision CNN on one synthetic batch, timed with a host clock.

    python benchmarks/plain_loop.py MODEL BATCH PRECISION FORMAT [STEPS] [WARMUP] [infer] [cpu] [size=N]
gpuvs's figures are held against this in the same command. It prints one JSON line: {"images_per_sec": ..., ...}."""

import json
import sys
import time

import torch
import torchvision


def main() -> None:
    model_name, bs, precision, fmt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    warmup = int(sys.argv[6]) if len(sys.argv) > 6 else 10
    infer = "infer" in sys.argv[7:]
    dev = "cpu" if "cpu" in sys.argv[7:] else "cuda"
    size = 299 if model_name == "inception_v3" else 224
    size = next((int(a[5:]) for a in sys.argv[7:] if a.startswith("size=")), size)
    kwargs = {"aux_logits": False, "init_weights": False} if model_name in ("inception_v3", "googlenet") else {}
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    cl = torch.channels_last if fmt == "NHWC" else torch.contiguous_format
    model = getattr(torchvision.models, model_name)(weights=None, **kwargs).to(dev).to(memory_format=cl)
    x = torch.randn(bs, 3, size, size, device=dev).contiguous(memory_format=cl)
    y = torch.randint(0, 1000, (bs,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(dev) if precision == "fp16" else None
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def step():
        if infer:
            with torch.inference_mode(), torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
                model(x)
            return
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=dtype, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    if infer:
        model.eval()
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    elapsed = time.perf_counter() - t0
    print(json.dumps({"model": model_name, "batch_size": bs, "precision": precision, "format": fmt,
                      "steps": steps, "images_per_sec": bs * steps / elapsed, "seconds": elapsed}))


if __name__ == "__main__":
    main()
