"""Small helpers every notebook uses: seeding, determinism, the device, its precision, versions."""
import contextlib
import os
import platform
import random
from dataclasses import dataclass

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

    With ``ATTNBOOK_DETERMINISM=warn`` in the environment an operation that has no
    deterministic kernel on this device warns instead of raising (the GPU call,
    ``attnbook.experiments.gpu_run``, sets it: one missing kernel must not cost a run that cannot be repeated).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_seed(seed)
    mode = os.environ.get("ATTNBOOK_DETERMINISM", "strict")
    if mode not in ("strict", "warn"):
        raise ValueError(f"ATTNBOOK_DETERMINISM={mode!r}: use strict (the default) or warn")
    torch.use_deterministic_algorithms(True, warn_only=mode == "warn")
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


# --- Mixed precision: what each device gets ---------------------------------------------------

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    """How a training step runs: ``dtype`` is the autocast dtype (None: no autocast, all in
    float32) and ``use_scaler`` says whether the loss needs a GradScaler (float16 only: its
    small range lets small gradients underflow to zero unless the loss is scaled up first).
    The weights, the optimiser and the loss stay in float32 in every case; autocast only runs
    the matrix products (and a few other ops) in the lower precision."""

    name: str                  # "fp32", "bf16" or "fp16": what metrics.json records
    dtype: torch.dtype | None
    use_scaler: bool
    reason: str = ""           # one line saying why this device got this precision

    def autocast(self, device: torch.device):
        """The autocast context of a forward pass (a no-op context in fp32)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.dtype)

    def grad_scaler(self, device: torch.device) -> "torch.amp.GradScaler":
        """A GradScaler for ``device``, enabled only for fp16 (disabled, its calls pass through)."""
        return torch.amp.GradScaler(device.type, enabled=self.use_scaler)


def choose_precision(device: torch.device | str, mode: str = "auto") -> Precision:
    """The precision a training step uses on ``device``.

    ``mode="auto"`` picks by what the device supports:

    * CUDA with bfloat16 tensor cores (compute capability 8.0 and newer: A100, L4, H100, ...):
      **bf16** autocast, no scaler. bfloat16 has float32's exponent range, so gradients do not
      underflow and no loss scaling is needed.
    * older CUDA (a T4 is 7.5, a V100 7.0): **fp16** autocast with a GradScaler. These GPUs have
      float16 tensor cores but no bfloat16 ones (PyTorch would emulate bf16, slowly); float16's
      range is small, so the loss is scaled up before backward and the gradients scaled back
      down before clipping and the optimiser step, skipping steps whose gradients overflowed.
    * Apple MPS: **fp16** autocast with a GradScaler. MPS autocast supports float16 since
      PyTorch 2.5 and ``GradScaler("mps")`` exists since 2.8; bfloat16 on MPS came later, needs
      macOS 14 or newer and its kernel coverage is still partial, so float16 is the safe choice.
    * CPU (and anything else): **fp32**, no autocast. CPU autocast exists, but on most laptop
      processors (without AVX-512 BF16 or AMX) bf16/fp16 matrix products are slower than
      float32 ones, and float32 keeps the book's CPU results exact and comparable.

    ``mode`` "fp32", "bf16" or "fp16" forces a precision (fp16 always with a scaler); the
    tests use this to run the bf16 and fp16 paths on the CPU, where PyTorch allows both.
    Forcing bf16 on a CUDA GPU without bf16 tensor cores is an error rather than a slow
    emulation.
    """
    if mode not in PRECISIONS:
        raise ValueError(f"unknown precision {mode!r}; choose one of {', '.join(PRECISIONS)}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    bf16_ok = cuda and torch.cuda.is_bf16_supported(including_emulation=False)
    if cuda and not bf16_ok:
        capability = ".".join(map(str, torch.cuda.get_device_capability(device)))
    if mode == "bf16" and cuda and not bf16_ok:
        raise ValueError(f"this GPU (compute capability {capability}) has no bfloat16 tensor "
                         "cores; use precision fp16 (or auto, which picks it)")
    if mode == "fp32":
        return Precision("fp32", None, False, "precision fp32 asked for")
    if mode == "bf16":
        return Precision("bf16", torch.bfloat16, False, "precision bf16 asked for")
    if mode == "fp16":
        return Precision("fp16", torch.float16, True, "precision fp16 asked for")
    if bf16_ok:
        return Precision("bf16", torch.bfloat16, False,
                         "CUDA GPU with bfloat16 tensor cores: bf16 autocast, no scaler")
    if cuda:
        return Precision("fp16", torch.float16, True,
                         f"CUDA compute capability {capability} has no bfloat16 tensor cores: "
                         "fp16 autocast with a GradScaler")
    if device.type == "mps":
        return Precision("fp16", torch.float16, True, "Apple MPS: fp16 autocast with a "
                         "GradScaler (bf16 depends on the macOS version)")
    return Precision("fp32", None, False, f"{device.type}: float32, no autocast")


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


def made_on_this_machine(result) -> bool:
    """Whether a committed result (the hardware its last call recorded, as :func:`versions`
    records it; or a call, or an old-style dict with an ``"environment"``) was made
    with this machine's processor and this version of PyTorch: there, a deterministic run on the
    CPU reproduces it bit for bit. Elsewhere floating-point details (another instruction set,
    another kernel) may differ, and a long training run with them."""
    calls = getattr(result, "calls", None)
    env = (calls[-1].hardware if calls else getattr(result, "hardware", None)
           or result.get("environment", {}))
    return env.get("cpu") == _cpu_name() and env.get("torch") == torch.__version__


def count_parameters(model: torch.nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def permutation_p(a, b) -> float:
    """One-sided exact permutation test that the values ``a`` are larger than the values ``b``
    (e.g. the BLEU of several seeds of two models): the share of all ways of splitting the
    pooled values into groups of ``len(a)`` and ``len(b)`` whose difference of means is at least
    the observed one. With 3 values against 3 there are 20 splits, so the smallest possible p
    is 1/20 = 0.05, reached when every value of ``a`` is above every value of ``b``."""
    import itertools
    a, b = [float(x) for x in a], [float(x) for x in b]
    if not a or not b:
        raise ValueError("permutation_p needs at least one value in each group")
    pooled, n = a + b, len(a)
    observed = sum(a) / n - sum(b) / len(b)
    total = sum(pooled)
    hits = splits = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        first = sum(pooled[i] for i in idx)
        diff = first / n - (total - first) / len(b)
        hits += diff >= observed - 1e-9
        splits += 1
    return hits / splits
