"""The benchmarks' ``--dtype auto``: what ``teamrl.hardware`` resolves on the machine they run on, printed with why.

A rollout benchmark decodes with a frozen module: ``auto`` is bf16 where bf16 is native (a GPU with bf16,
a CPU with AMX or AVX-512 BF16) and float32 elsewhere, as ``dtype: auto`` for a frozen model. A learner
benchmark keeps float32 weights (AdamW needs them) and autocasts to bf16 where it is native and its products are
fast, as ``train_autocast: auto``. It leaves out everything else the config resolves (devices, rollout copies).
"""

from __future__ import annotations


def native(device: str, *, fast: bool = False) -> tuple[bool, str]:
    """Whether bf16 is native on ``device`` (``cpu``, ``cuda``, ``cuda:N``) here, and why; with ``fast``, native and
    fast enough for the update's autocast (``teamrl.hardware.bf16_fast``)."""
    from teamrl.hardware import bf16_fast, bf16_native, detect

    return (bf16_fast if fast else bf16_native)("cpu" if device == "cpu" else ("cuda:0" if device == "cuda" else device),
                                               detect())


def rollout_dtype(setting: str, device: str) -> str:
    """``setting``, or for ``auto`` bf16 where native else float32; prints the choice and its reason."""
    if setting != "auto":
        print(f"dtype {setting} (set)", flush=True)
        return setting
    ok, why = native(device)
    dtype = "bfloat16" if ok else "float32"
    print(f"dtype {dtype} (auto: {why}{'' if ok else '; bf16 would be emulated, slower than float32'})", flush=True)
    return dtype


def learner_autocast(setting: bool | None, device: str) -> bool:
    """``setting``, or for None (auto) bf16 autocast where native and fast (``teamrl.hardware.bf16_fast``, as
    ``train_autocast: auto``); prints the choice and its reason."""
    if setting is not None:
        print(f"autocast {'bfloat16' if setting else 'none'} (set)", flush=True)
        return setting
    ok, why = native(device, fast=True)
    print(f"autocast {'bfloat16' if ok else 'none'} (auto: {why})", flush=True)
    return ok
