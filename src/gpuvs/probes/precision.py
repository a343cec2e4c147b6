"""What a workload's --precision means to torch: TF32 or not, the operands' dtype, the autocast, the loss scaling.

fp32 is strict float32; tf32 allows TF32 tensor-core math; fp16 and bf16 run float32 weights under autocast.
torch is imported inside each function, so the workload registry is discovered without torch."""

from __future__ import annotations

import contextlib
from typing import Any

AUTOCAST = ("fp16", "bf16")


def tf32(precision: str) -> bool:
    """Whether TF32 math is allowed: only when asked for by name."""
    return precision == "tf32"


def allow_tf32(precision: str) -> None:
    """cuBLAS matmuls and cuDNN convolutions/RNNs: TF32 for tf32, strict fp32 otherwise (CNN, NLP)."""
    import torch

    on = tf32(precision)
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def matmul_precision(precision: str) -> None:
    """torch's float32 matmul precision alone: "high" (TF32) for tf32, else "highest" (gemm, kernels)."""
    import torch

    torch.set_float32_matmul_precision("high" if tf32(precision) else "highest")


def dtype(precision: str) -> Any:
    """The torch dtype a tensor of this precision is held in (tf32 is float32 math); None for others
    (gemm's fp8 is its own)."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}.get(precision)


def autocast(precision: str, device: Any):
    """The context a step runs in: torch.autocast to fp16 or bf16 on the device's type, else nothing."""
    if precision not in AUTOCAST:
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device.type, dtype=dtype(precision))


def grad_scaler(precision: str, device: Any):
    """fp16 training scales the loss (a GradScaler on the device's type); every other precision: None."""
    if precision != "fp16":
        return None
    import torch

    return torch.amp.GradScaler(device.type)
