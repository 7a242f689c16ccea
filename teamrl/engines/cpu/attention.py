"""A decode-attention kernel for the fast loop on CPU: one query token per row, GQA, bf16 or fp32.

At decode batch sizes the attention of a step is many tiny problems (per row and kv head: a few
query heads against a few hundred cached keys), and torch's CPU flash kernel spends most of its
time on per-block matmul calls: ~0.5 ms per layer at 32 rows and ~136 columns, twice the time of
reading the keys and values once. This kernel reads each row's keys once for all the query heads
that share them, keeps scores and the softmax in fp32, and reads the values once, in one pass over
blocks of 16 columns (an online softmax: a block's values are read while its keys are still in
cache): about 1.6x faster per call at 8-64 rows than torch's (``benchmarks/decode_step.py
--attention``, ``docs/results/speed.md``), and the one pass 1.2x faster than two in float32.

The same library holds the fused decode step's other calls (:func:`rope_attention`,
:func:`add_rms_norm`, :func:`silu_mul`; see :func:`teamrl.engines.cpu.fused_step.fused_step`) and, where it is built with
AVX2 and FMA or AVX-512, a float32 product for a decode step's few rows (wrapped by
:mod:`teamrl.engines.cpu.panel`).

It is C (``csrc/decode_attention.c``, shipped in the package), compiled on first use with the
system's C compiler (``cc``, ``-O3``, OpenMP, and per architecture: ``-march=native`` on x86_64, or
the instruction set torch's kernels are capped at by ``ATEN_CPU_CAPABILITY``; ``-mcpu=native`` on aarch64) into ``$TEAMRL_CACHE/kernels/`` and loaded with ``ctypes``; the
build is keyed by the source, the flags, the compiler and the CPU. Where the platform is not
Linux, the architecture is neither x86_64 nor aarch64, torch's OpenMP runtime is not GNU's (the
kernel must share torch's thread pool, not start a second one), no compiler is found or the build
fails, :func:`load` returns None and the fast loop calls torch's kernel instead (logged once).
Whether the fast loop tries the kernel at all is the caller's choice
(``FastDecoder(attention_kernel=...)``, ``HFEngine(cpu_kernel=...)``). Results agree with
``F.scaled_dot_product_attention`` to the rounding of the output (checked when the library is
loaded, and in ``tests/engines``); they are not bit-identical to it (another summation order).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCE_PATH = Path(__file__).resolve().parent / "csrc" / "decode_attention.c"

# Per platform.machine(): the architecture flags of the build. Elsewhere the kernel is not built.
ARCH_FLAGS: dict[str, list[str]] = {
    "x86_64": ["-march=native", "-mprefer-vector-width=512"],
    "aarch64": ["-mcpu=native"],
}
MAX_G, MAX_D = 16, 256  # the kernel's stack arrays: query heads per kv head, head dimension
_DTYPES = (torch.bfloat16, torch.float32)

_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: unavailable


# x86-64: torch's CPU capability (``torch.backends.cpu.get_cpu_capability()``; ``ATEN_CPU_CAPABILITY`` caps it) ->
# the architecture flags that use no more than its instructions (the CPU's own, without AVX-512, for AVX2: a
# CPU that is AVX2-only builds exactly as with -march=native); any other capability builds for the CPU itself.
X86_CAPPED: dict[str, list[str]] = {"AVX2": ["-march=native", "-mno-avx512f"], "DEFAULT": ["-march=x86-64"]}


def compile_flags(machine: str, capability: str | None = None) -> list[str] | None:
    """The compiler flags for architecture ``machine`` (as ``platform.machine()`` names it), None where unsupported.

    On x86-64 the kernel uses the instructions torch's own kernels use: ``capability`` (torch's CPU
    capability) AVX2 or DEFAULT, which ``ATEN_CPU_CAPABILITY`` can force on a larger CPU, builds for
    the CPU without its AVX-512 instructions or for baseline x86-64; otherwise the build is for the CPU itself.
    -ffast-math for the compile only (vectorised expf from glibc's libmvec): linked with it, the library
    would switch the whole process to flush-to-zero when loaded.

    >>> compile_flags("x86_64")
    ['-O3', '-march=native', '-mprefer-vector-width=512', '-ffast-math', '-fopenmp', '-fPIC']
    >>> compile_flags("x86_64", "AVX2")
    ['-O3', '-march=native', '-mno-avx512f', '-ffast-math', '-fopenmp', '-fPIC']
    >>> compile_flags("aarch64")
    ['-O3', '-mcpu=native', '-ffast-math', '-fopenmp', '-fPIC']
    >>> compile_flags("riscv64") is None
    True
    """
    arch = ARCH_FLAGS.get(machine)
    if machine == "x86_64" and capability in X86_CAPPED:
        arch = X86_CAPPED[capability]
    return None if arch is None else ["-O3", *arch, "-ffast-math", "-fopenmp", "-fPIC"]


def _capability() -> str | None:
    """torch's CPU capability in this process (AVX512, AVX2, DEFAULT, ...), or None where torch does not say."""
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get() if get is not None else None


def link_flags(cc: str) -> list[str]:
    """The link flags: a shared library on GNU OpenMP, with glibc's vector maths (libmvec) where ``cc`` finds it."""
    found = subprocess.run([cc, "-print-file-name=libmvec.so"], capture_output=True, text=True, timeout=30).stdout
    mvec = ["-lmvec"] if os.path.isabs(found.strip()) else []
    return ["-shared", "-fopenmp", *mvec, "-lm"]


def _cpu_key() -> str:
    """What identifies this CPU's instruction set (x86: model and flags; Arm: implementer, part and features)."""
    fields = ("model name", "flags", "Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part")
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    first: dict[str, str] = {}
    for ln in lines:
        name = ln.split(":", 1)[0].strip()
        if name in fields and name not in first:
            first[name] = ln
    return platform.machine() + "".join(first[n] for n in fields if n in first)


def _torch_uses_gnu_openmp() -> bool:
    """Whether GNU's libgomp is loaded (torch's own): the kernel's OpenMP calls then share its thread pool."""
    try:
        with open("/proc/self/maps") as f:
            return "libgomp" in f.read()
    except OSError:
        return False


def _build(cc: str, flags: list[str]) -> Path:
    """Compile the kernel with ``cc`` and ``flags`` into the cache (once per source, flags, compiler and CPU)."""
    from teamrl.models import cache_dir

    source = SOURCE_PATH.read_text()
    link = link_flags(cc)
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([source, *flags, *link, version, _cpu_key()]).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"decode_attention-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, obj, lib = Path(tmp) / "decode_attention.c", Path(tmp) / "decode_attention.o", Path(tmp) / "lib.so"
        src.write_text(source)
        for cmd in ([cc, *flags, "-c", str(src), "-o", str(obj)], [cc, str(obj), "-o", str(lib), *link]):
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:2])} ... failed: {res.stderr.strip()[-500:]}")
        os.replace(lib, out)  # atomic: concurrent builders (Ray workers) each install a complete file
    return out


def _unavailable() -> str | None:
    """Why the kernel cannot be built in this process (None: it can be tried)."""
    if platform.system() != "Linux":
        return f"the platform is {platform.system()}, not Linux"
    if compile_flags(platform.machine()) is None:
        return f"no build flags for architecture {platform.machine()!r} (supported: {', '.join(ARCH_FLAGS)})"
    if not _torch_uses_gnu_openmp():
        return "torch does not run on GNU OpenMP here"
    return None


def load() -> ctypes.CDLL | None:
    """The compiled kernel library (built on first use), or None where it cannot be used here (reason logged once)."""
    global _lib
    if _lib is not False:
        return _lib  # type: ignore[return-value]
    _lib = None
    reason = _unavailable()
    if reason is not None:
        log.info("CPU decode-attention kernel not used (torch's kernel is): %s", reason)
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        log.info("CPU decode-attention kernel not used (torch's kernel is): no C compiler (cc) found")
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc, compile_flags(platform.machine(), _capability()) or [])))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("CPU decode-attention kernel not used (torch's kernel is): %s", e)
        return None
    P, I64, F32, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    signatures = {
        "decode_attention": [P, I64, P, P, P, P] + [I64] * 5 + [F32, INT],
        "rope_attention": [P, I64, P, P, P, P, P, P] + [I64] * 5 + [F32, INT],
        "add_rms_norm": [P, P, P, P, I64, I64, F32, INT],
        "silu_mul": [P, I64, P, I64, I64, INT],
    }
    for name, args in signatures.items():
        for suffix in ("bf16", "f32"):
            fn = getattr(lib, f"{name}_{suffix}")
            fn.restype, fn.argtypes = None, args
    lib.panel_width.restype, lib.panel_width.argtypes = I64, []
    lib.panel_pack_f32.restype, lib.panel_pack_f32.argtypes = None, [P, I64, I64, P, INT]
    lib.panel_linear_f32.restype, lib.panel_linear_f32.argtypes = None, [P, I64, I64, I64, P, I64, P, P, INT]
    if not _self_check(lib):
        log.warning("CPU decode-attention kernel not used: its results disagree with torch's here")
        return None
    _lib = lib
    return lib


def supports(q_dtype: torch.dtype, device: torch.device, n_heads: int, n_kv: int, head_dim: int) -> bool:
    """Whether the kernel handles attention of this dtype, device and head layout."""
    return device.type == "cpu" and q_dtype in (torch.bfloat16, torch.float32) and n_heads % n_kv == 0 \
        and n_heads // n_kv <= MAX_G and head_dim <= MAX_D


def _checked_shape(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   lens: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(B, H, G, D, C), or TypeError / ValueError where the tensors do not fit the kernel (it reads raw pointers)."""
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or v.shape != ks:
        raise ValueError(f"decode_attention: q must be [B, H, G, D] and k, v both [rows, H, C, D]; got q {tuple(qs)}, "
                         f"k {tuple(ks)}, v {tuple(v.shape)}")
    dtype = q.dtype
    if k.dtype != dtype or v.dtype != dtype or dtype not in _DTYPES:
        raise TypeError(f"decode_attention: q, k, v must all be bfloat16 or all float32; got {dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if lens.dtype != torch.int64:
        raise TypeError(f"decode_attention: lens must be int64; got {lens.dtype}")
    if not (q.is_cpu and k.is_cpu and v.is_cpu and lens.is_cpu):
        raise ValueError("decode_attention: all tensors must be on the CPU; use torch's attention on other devices")
    B, H, G, D = qs
    C = ks[2]
    if G > MAX_G or D > MAX_D:
        raise ValueError(f"decode_attention: at most {MAX_G} query heads per kv head and head_dim {MAX_D}; got "
                         f"{G} and {D} (check supports() first)")
    st = q.stride()
    if st[3] != 1 or st[2] != D or st[1] != G * D:
        raise ValueError(f"decode_attention: q's last three dims must be dense; got strides {st} (pass q.contiguous())")
    if ks[0] < B or ks[1] != H or ks[3] != D:
        raise ValueError(f"decode_attention: k and v must be [rows >= {B}, {H}, C, {D}]; got {tuple(ks)}")
    if not (k.is_contiguous() and v.is_contiguous() and lens.is_contiguous()):
        raise ValueError("decode_attention: k, v and lens must be contiguous (pass .contiguous())")
    if lens.shape != (B,):
        raise ValueError(f"decode_attention: lens must be [{B}]; got {tuple(lens.shape)}")
    return B, H, G, D, C


def decode_attention(lib: ctypes.CDLL, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Attention of one query token per row: q [B, H, G, D] (last three dims dense), k / v [rows >= B, H, C, D]
    contiguous, lens [B] int64 visible columns (1 <= lens[b] <= C, not checked); returns [B, H, G, D].
    All on the CPU; layouts and dtypes are checked (TypeError / ValueError)."""
    B, H, G, D, C = _checked_shape(q, k, v, lens)
    out = torch.empty((B, H, G, D), dtype=q.dtype)
    fn = lib.decode_attention_bf16 if q.dtype == torch.bfloat16 else lib.decode_attention_f32
    fn(q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), out.data_ptr(), lens.data_ptr(), B, H, G, D, C,
       scale, torch.get_num_threads())
    return out


def _same(dtype: torch.dtype, *ts: torch.Tensor | None) -> bool:
    return all(t is None or (t.dtype == dtype and t.is_cpu) for t in ts) and dtype in _DTYPES


def _fn(lib: ctypes.CDLL, name: str, dtype: torch.dtype):
    return getattr(lib, f"{name}_{'bf16' if dtype == torch.bfloat16 else 'f32'}")


def rope_attention(lib: ctypes.CDLL, qkv: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, pos: torch.Tensor, scale: float, out: torch.Tensor) -> torch.Tensor:
    """One decode step's attention of a layer from its fused q/k/v product, in one call: rotates each row's queries
    and keys (``x * cos + roll(x, D/2) * ssin``, as the fast loop's ``_rope``), writes its key and value into the
    cache ``k``, ``v`` [rows >= B, H, C, D] at column ``pos[b]`` and attends over columns ``0 .. pos[b]``.

    ``qkv`` [B, (H*G + 2H) * D]: queries, keys, values (last dim dense); ``cos``, ``ssin`` [B, D]; ``pos`` [B] int64
    (``0 <= pos[b] < C``, not checked); ``out`` [B, H, G, D], returned. All on the CPU,
    one dtype (bf16 or float32); layouts are checked (TypeError / ValueError).
    """
    B, H, G, D = out.shape
    C = k.shape[2]
    if not (_same(qkv.dtype, cos, ssin, k, v, out) and pos.dtype == torch.int64 and pos.is_cpu):
        raise TypeError("rope_attention: qkv, cos, ssin, k, v and out must share one dtype (bfloat16 or float32) on "
                        "the CPU, and pos be int64")
    if G > MAX_G or D > MAX_D or D % 2:
        raise ValueError(f"rope_attention: at most {MAX_G} query heads per kv head and an even head_dim <= {MAX_D}; "
                         f"got {G} and {D}")
    if qkv.shape != (B, (H * G + 2 * H) * D) or qkv.stride(1) != 1:
        raise ValueError(f"rope_attention: qkv must be [{B}, {(H * G + 2 * H) * D}] with a dense last dim; got "
                         f"{tuple(qkv.shape)}, strides {qkv.stride()}")
    if cos.shape != (B, D) or ssin.shape != (B, D) or pos.shape != (B,) or k.shape != v.shape or k.dim() != 4 \
            or k.shape[0] < B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(f"rope_attention: cos, ssin [{B}, {D}], pos [{B}], k and v [rows >= {B}, {H}, C, {D}] "
                         f"expected; got {tuple(cos.shape)}, {tuple(ssin.shape)}, {tuple(pos.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not all(t.is_contiguous() for t in (cos, ssin, k, v, pos, out)):
        raise ValueError("rope_attention: cos, ssin, k, v, pos and out must be contiguous")
    _fn(lib, "rope_attention", qkv.dtype)(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), ssin.data_ptr(), k.data_ptr(),
                                          v.data_ptr(), pos.data_ptr(), out.data_ptr(), B, H, G, D, C, scale,
                                          torch.get_num_threads())
    return out


def add_rms_norm(lib: ctypes.CDLL, h: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor, eps: float,
                 out: torch.Tensor) -> torch.Tensor:
    """``h += d`` in place (``d`` None: no add), then ``out = w * rms_norm(h)`` (statistics in fp32, rounded to
    the dtype before the weight, as a Llama-style RMSNorm module): the residual add and the next norm of a decode
    step in one call. ``h``, ``d``, ``out`` [B, N] and ``w`` [N] contiguous, one dtype on the CPU; returns ``out``."""
    B, N = h.shape
    if not _same(h.dtype, d, w, out):
        raise TypeError("add_rms_norm: h, d, w and out must share one dtype (bfloat16 or float32) on the CPU")
    if (d is not None and d.shape != h.shape) or out.shape != h.shape or w.shape != (N,) or \
            not all(t is None or t.is_contiguous() for t in (h, d, w, out)):
        raise ValueError(f"add_rms_norm: h, d and out must be contiguous [{B}, {N}] and w [{N}]")
    _fn(lib, "add_rms_norm", h.dtype)(h.data_ptr(), None if d is None else d.data_ptr(), w.data_ptr(), out.data_ptr(),
                                      B, N, eps, torch.get_num_threads())
    return out


def silu_mul(lib: ctypes.CDLL, gu: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out = silu(gate) * up`` for ``gu`` [B, 2I] = [gate | up] (last dim dense) and ``out`` [B, I] contiguous,
    one dtype on the CPU (the product of the silu rounded to it first, as torch's two operations); returns ``out``."""
    B, I = out.shape
    if not _same(gu.dtype, out):
        raise TypeError("silu_mul: gu and out must share one dtype (bfloat16 or float32) on the CPU")
    if gu.shape != (B, 2 * I) or gu.stride(1) != 1 or not out.is_contiguous():
        raise ValueError(f"silu_mul: gu must be [{B}, {2 * I}] with a dense last dim and out contiguous [{B}, {I}]; "
                         f"got {tuple(gu.shape)}")
    _fn(lib, "silu_mul", gu.dtype)(gu.data_ptr(), gu.stride(0), out.data_ptr(), B, I, torch.get_num_threads())
    return out


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """The same attention with ``F.scaled_dot_product_attention`` in fp32 (for checks)."""
    B = q.shape[0]
    mask = (torch.arange(k.shape[2]) < lens[:, None])[:, None, None]
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k[:B].float(), v[:B].float(), attn_mask=mask,
                                                            scale=scale)


def rope_reference(qkv: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   pos: torch.Tensor, scale: float, G: int) -> torch.Tensor:
    """:func:`rope_attention` with torch's operations (the fast loop's unfused step; writes ``k``, ``v``)."""
    B, (H, D) = qkv.shape[0], k.shape[1::2]
    x = qkv.view(B, H * G + 2 * H, D)
    qk = (x[:, : H * G + H] * cos[:, None]).add_(x[:, : H * G + H].roll(D // 2, -1) * ssin[:, None])
    rows = torch.arange(B)[:, None]
    k[rows, torch.arange(H), pos[:, None]] = qk[:, H * G :]
    v[rows, torch.arange(H), pos[:, None]] = x[:, H * G + H :]
    return reference(qk[:, : H * G].reshape(B, H, G, D), k, v, pos + 1, scale)


def norm_reference(h: torch.Tensor, d: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`add_rms_norm` with torch's operations (a Llama-style RMSNorm module; adds ``d`` into ``h``)."""
    if d is not None:
        h += d
    y = h.float()
    return w * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def _self_check(lib: ctypes.CDLL) -> bool:
    """Whether the library's results agree with torch's on small random problems (fp32 and bf16): :func:`reference`,
    :func:`rope_reference`, :func:`norm_reference` and ``silu(gate) * up``."""
    g = torch.Generator().manual_seed(0)
    B, H, G, D, C = 3, 2, 3, 64, 40
    lens = torch.tensor([1, 17, 40])
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        def rand(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            return torch.randn(shape, generator=g).to(dtype)

        q, k, v = rand(B, H, G, D), rand(B + 1, H, C, D), rand(B + 1, H, C, D)
        got = decode_attention(lib, q, k, v, lens, 0.125)
        ok = torch.allclose(got.float(), reference(q, k, v, lens, 0.125), atol=tol, rtol=0)
        qkv, cos, ssin = rand(B, (H * G + 2 * H) * D), rand(B, D), rand(B, D)
        k2, v2 = k.clone(), v.clone()
        got = rope_attention(lib, qkv, cos, ssin, k2, v2, lens - 1, 0.125, torch.empty((B, H, G, D), dtype=dtype))
        want = rope_reference(qkv, cos, ssin, k, v, lens - 1, 0.125, G)
        ok = ok and torch.allclose(got.float(), want, atol=tol, rtol=0) and torch.allclose(k2, k, atol=tol, rtol=0) \
            and torch.equal(v2, v)
        h, d, w = rand(B, 96), rand(B, 96), rand(96)
        h2 = h.clone()
        got = add_rms_norm(lib, h2, d, w, 1e-5, torch.empty_like(h))
        ok = ok and torch.allclose(got, norm_reference(h, d, w, 1e-5), atol=tol, rtol=tol) and torch.equal(h2, h)
        gu = rand(B, 2 * 96)
        got = silu_mul(lib, gu, torch.empty((B, 96), dtype=dtype))
        want = torch.nn.functional.silu(gu[:, :96]) * gu[:, 96:]
        if not (ok and torch.allclose(got, want, atol=tol, rtol=tol)):
            return False
    return True
