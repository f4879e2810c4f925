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


def _cpu_name() -> str:
    """The processor's model name (Linux: /proc/cpuinfo; elsewhere what platform knows)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# --- The arithmetic of a CPU: what decides a run's last bits -----------------------------------
#
# Two processors with the same model name can compute different last bits: PyTorch picks its
# vector kernels by what the CPU can do (AVX2, AVX-512, ...), and MKL and oneDNN do the same for
# matrix products. A float32 sum done in another order rounds differently, and a training run
# amplifies the difference until it is as large as a change of seed. The environment variables
# below lower the kernels a machine uses (`make test-portable` sets them).
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_capability() -> str:
    """The vector instructions PyTorch's CPU kernels use here: "AVX512", "AVX2", "DEFAULT" on
    x86; "SVE256", "DEFAULT" ... on arm64 (``torch.backends.cpu.get_cpu_capability()``, which
    ``ATEN_CPU_CAPABILITY`` can lower)."""
    return torch.backends.cpu.get_cpu_capability()


def _cpu_flags() -> set[str]:
    """The processor's feature flags (Linux: /proc/cpuinfo's "flags" on x86, "Features" on
    arm64; macOS on Apple silicon: the sysctl hw.optional.arm.FEAT_* that are 1); empty when
    unknown."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.split(":")[0].strip() in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess
        try:
            out = subprocess.run(["sysctl", "hw.optional.arm"], capture_output=True, text=True,
                                 timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return set()
        return {line.split(":")[0].rsplit(".", 1)[-1].lower() for line in out.splitlines()
                if line.strip().endswith(": 1")}
    return set()


# oneDNN's ISA levels that multiply bfloat16 natively (ONEDNN_MAX_CPU_ISA below these emulates)
_ONEDNN_BF16 = ("ALL", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
                "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16",
                "AVX10_2_512", "AVX10_2_512_AMX_2")


def native_bf16() -> tuple[bool, str]:
    """Whether this CPU multiplies bfloat16 matrices in hardware, and why, in a few words.

    Yes on x86 with AVX-512 BF16 or AMX (flags ``avx512_bf16``, ``amx_bf16``) and on arm64 with
    the bf16 extension (``bf16``, macOS: ``feat_bf16``, Apple M2 and later). Elsewhere PyTorch
    emulates bfloat16 in float32 arithmetic, about a hundred times slower than float32 itself
    (a 1,024² product: 1 GFLOP/s against 134 on an AVX2 server). Read from the flags, so it
    takes no time and gives the same answer every run; ``ATEN_CPU_CAPABILITY`` or
    ``ONEDNN_MAX_CPU_ISA`` set below AVX-512 count as no."""
    flags = _cpu_flags()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "x86"):
        found = sorted({"avx512_bf16", "amx_bf16"} & flags)
        if not found:
            return False, "this x86 CPU has neither AVX-512 BF16 nor AMX"
        if not cpu_capability().startswith("AVX512"):
            return False, f"PyTorch's kernels are capped at {cpu_capability()}"
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
        if cap not in _ONEDNN_BF16:
            return False, f"oneDNN is capped at {cap} (ONEDNN_MAX_CPU_ISA)"
        return True, "x86 with " + " and ".join(f.upper().replace("_", "-", 1) for f in found)
    if machine in ("arm64", "aarch64"):
        if {"bf16", "feat_bf16"} & flags:
            return True, "arm64 with the bf16 extension"
        return False, "this arm64 CPU has no bf16 extension" if flags else \
            "this arm64 CPU's features are unknown"
    return False, f"no native bfloat16 known on {machine or 'this machine'}"


def arithmetic() -> dict:
    """What decides the last bits of a deterministic CPU run here: the processor, the kernels
    PyTorch uses on it, PyTorch's version, and any caps set on MKL or oneDNN. Two machines with
    the same arithmetic() compute the same bits; others may differ in the last ones."""
    out = {"cpu": _cpu_name(), "cpu_capability": cpu_capability(), "torch": torch.__version__}
    caps = {k: os.environ[k] for k in ISA_CAPS[1:] if os.environ.get(k)}
    if caps:
        out["isa_caps"] = caps
    return out


def versions() -> dict:
    """Versions of Python and the libraries the book depends on, plus the hardware in use:
    the processor, its :func:`arithmetic` (vector kernels, caps) and whether it has native
    bfloat16."""
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
        **arithmetic(),
        "native_bf16": native_bf16()[0],
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


# --- Mixed precision: what each device gets ---------------------------------------------------

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "bf16-if-native")


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

    ``mode="bf16-if-native"`` (the ``cpu-speedrun`` preset's) is bf16 autocast where the
    hardware computes bfloat16 natively: a CPU with AVX-512 BF16, AMX or arm64's bf16
    (:func:`native_bf16`), or what "auto" picks on a GPU; on any other CPU it is float32, and
    its ``reason`` says why in one line.

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
    if mode == "bf16-if-native" and device.type == "cpu":
        native, why = native_bf16()
        if native:
            return Precision("bf16", torch.bfloat16, False, f"bf16 autocast: {why}")
        return Precision("fp32", None, False, f"float32, not bf16: {why}, so bf16 would be "
                         "emulated, about 100 times slower than float32")
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


def recorded_arithmetic(result) -> dict:
    """The :func:`arithmetic` a committed result was made with: the hardware its last call
    recorded (a :class:`~attnbook.store.Result`, a call, a dict with "calls" or
    an old-style one with an "environment")."""
    calls = getattr(result, "calls", None)
    if calls is None and isinstance(result, dict) and result.get("calls"):
        calls = result["calls"]
    if calls:
        last = calls[-1]
        env = last.hardware if hasattr(last, "hardware") else last.get("hardware", {})
    else:
        env = getattr(result, "hardware", None) or result.get("environment", {})
    keys = ("cpu", "cpu_capability", "torch")
    return {k: env.get(k) for k in keys} | ({"isa_caps": env["isa_caps"]}
                                            if env.get("isa_caps") else {})


def made_on_this_machine(result) -> bool:
    """Whether a committed result was made with this machine's :func:`arithmetic`: the same
    processor, the same vector kernels (``cpu_capability``), the same PyTorch and no other caps.
    There a deterministic CPU run reproduces it bit for bit. Elsewhere (another processor,
    another instruction set: an AVX2 laptop against an AVX-512 server, Apple silicon) the last
    bits differ, and a training run amplifies them up to the size of a change of seed.
    A result that did not record its ``cpu_capability`` counts as made elsewhere."""
    return recorded_arithmetic(result) == arithmetic()


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
