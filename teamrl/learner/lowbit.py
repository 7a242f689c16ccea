"""AdamW with block-wise 8-bit moments (``models.<m>.optim.states: 8bit``), from torchao.

torchao's ``AdamW8bit`` keeps each moment of a parameter with at least 4096 values as uint8 codes
into a fixed 256-entry map plus one float32 scale per block of 256 values (Dettmers et al.,
arXiv 2110.02861), so the two moments take about 2 bytes per parameter instead of 8; smaller
tensors keep float32 moments. The arithmetic of a step is float32.

Its moments are tensor subclasses, which safetensors cannot store. A checkpoint therefore holds
each one as its codes, scales and sign (:func:`pack_states`), and :func:`unpack_states` rebuilds
the very same moments: resuming is exact, and the checkpoint stays small.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

INSTALL = "pip install 'teamrl[lowbit]'"


def available() -> bool:
    """Whether torchao is installed."""
    return importlib.util.find_spec("torchao") is not None


def adamw_8bit(groups: list[dict[str, Any]], *, betas: tuple[float, float]) -> torch.optim.Optimizer:
    """torchao's AdamW8bit over ``groups`` (each with its own lr and weight decay)."""
    if not available():
        raise ImportError(f"optim.states: 8bit needs torchao ({INSTALL}); or set optim.states: float32")
    from torchao.optim import AdamW8bit

    return AdamW8bit(groups, betas=betas)


def pack_states(optimizer_state: dict[str, Any]) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Split an optimizer ``state_dict()`` into the plain part and the 8-bit moments.

    Returns (the state dict without the 8-bit moments, ``{param id: {key: {"codes", "scale", "signed"}}}``).
    A state dict without 8-bit moments comes back unchanged with an empty second part.
    """
    from torchao.optim.subclass_8bit import OptimState8bit

    plain: dict[int, dict[str, Any]] = {}
    quantized: dict[int, dict[str, Any]] = {}
    for pid, st in optimizer_state["state"].items():
        plain[pid] = {}
        for key, value in st.items():
            if isinstance(value, OptimState8bit):
                quantized.setdefault(pid, {})[key] = {"codes": value.codes, "scale": value.scale,
                                                       "signed": bool(value.signed)}
            else:
                plain[pid][key] = value
    if not quantized:
        return optimizer_state, {}
    return {**optimizer_state, "state": plain}, quantized


def unpack_states(optimizer: torch.optim.Optimizer, quantized: dict[int, dict[str, Any]]) -> None:
    """Put the moments :func:`pack_states` split off back into ``optimizer`` (after its ``load_state_dict``),
    as 8-bit moments on each parameter's device."""
    if not quantized:
        return
    from torchao.optim.subclass_8bit import OptimState8bit, get_qmap_signed, get_qmap_unsigned

    params = [p for group in optimizer.param_groups for p in group["params"]]
    for pid, moments in quantized.items():
        pid = int(pid)
        if not 0 <= pid < len(params):
            raise ValueError(f"8-bit optimizer state for parameter {pid}, but the optimizer has {len(params)}")
        p = params[pid]
        for key, m in moments.items():
            codes, scale = m["codes"].to(p.device), m["scale"].to(p.device, torch.float32)
            if codes.shape != p.shape:
                raise ValueError(f"8-bit optimizer state {key} of parameter {pid} has shape {tuple(codes.shape)}, "
                                 f"the parameter {tuple(p.shape)}")
            qmap = torch.tensor(get_qmap_signed() if m["signed"] else get_qmap_unsigned(), dtype=torch.float32,
                                device=p.device)
            optimizer.state[p][key] = OptimState8bit(codes, scale, qmap, bool(m["signed"]), dtype=p.dtype)
