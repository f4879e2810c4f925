"""Small helpers every notebook uses: seeding, determinism, the device, versions."""
import os
import platform
import random

import numpy as np
import torch


def set_seed(seed: int = 0) -> None:
    """Seed Python, NumPy and PyTorch (CPU and all GPUs)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def deterministic(seed: int = 0) -> None:
    """Seed everything and make PyTorch pick deterministic kernels.

    Notebook outputs are compared cell by cell in the test suite, so each notebook starts with
    this. On a GPU, cuBLAS also needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (set by the Makefile,
    and set here if missing, which is enough as long as no CUDA work has run yet).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def get_device(prefer: str | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` ("cpu", "cuda", "mps") forces a choice; the environment variable
    ``ATTNBOOK_DEVICE`` does the same without changing code.
    """
    choice = prefer or os.environ.get("ATTNBOOK_DEVICE")
    if choice:
        if choice not in ("cpu", "cuda", "mps") and not choice.startswith("cuda:"):
            raise ValueError(f"unknown device {choice!r}: use cpu, cuda (or cuda:N) or mps")
        if choice.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device {choice!r} requested, but PyTorch sees no CUDA GPU; "
                               "use cpu, or install the CUDA build of torch (README, GPU notes)")
        if choice == "mps" and not (getattr(torch.backends, "mps", None) is not None
                                    and torch.backends.mps.is_available()):
            raise RuntimeError("device 'mps' requested, but Apple's MPS is not available; use cpu")
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo; elsewhere what platform knows)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict:
    """Versions of Python and the libraries the book depends on, plus the hardware in use."""
    import matplotlib
    import sentencepiece

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "matplotlib": matplotlib.__version__,
        "sentencepiece": sentencepiece.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        import sacrebleu

        info["sacrebleu"] = sacrebleu.__version__
    except ImportError:  # pragma: no cover - sacrebleu is in requirements.txt
        info["sacrebleu"] = None
    return info


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
