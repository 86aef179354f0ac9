"""The state dict every benchmark saves, and how a saved checkpoint is loaded and checked."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp

from ckptspec.spec.harness.surface.loading import checkpoint_format

__all__ = [
    "GiB",
    "MiB",
    "clone_state_dict",
    "load_checkpoint",
    "make_state_dict",
    "negate_",
    "random_bytes",
    "saved_before_update",
    "staged_bytes",
    "tensors",
]

MiB = 1 << 20
GiB = 1 << 30
LAYERS = 16


def make_state_dict(nbytes: int, device: str = "cpu") -> dict:
    """A model-like state dict of about `nbytes`: LAYERS float32 weights, LAYERS small biases, a step.

    Values are random normals (no exact zeros), so `negate_` changes every element.
    """
    if nbytes < LAYERS * 4 * 1024:
        raise ValueError(f"state dict size {nbytes} B is below the minimum of {LAYERS * 4} KiB")
    generator = torch.Generator(device).manual_seed(0)
    per_layer = nbytes // LAYERS // 4 - 256
    model = {}
    for i in range(LAYERS):
        model[f"layer{i}.weight"] = torch.randn(per_layer, generator=generator, device=device)
        model[f"layer{i}.bias"] = torch.randn(256, generator=generator, device=device)
    return {"model": model, "step": 1000}


def clone_state_dict(state_dict: dict) -> dict:
    """A copy with private tensors."""
    return {"model": {k: t.clone() for k, t in tensors(state_dict).items()}, "step": state_dict["step"]}


def tensors(state_dict: dict) -> dict[str, torch.Tensor]:
    return state_dict["model"]


def staged_bytes(state_dict: dict) -> int:
    """Bytes of tensor data a save has to stage."""
    return sum(t.numel() * t.element_size() for t in tensors(state_dict).values())


def negate_(state_dict: dict) -> None:
    """The next training step, reduced to an exact in-place update of every tensor."""
    for t in tensors(state_dict).values():
        t.neg_()


def load_checkpoint(family: str, path: str, like: dict) -> dict:
    """Load what a peer of `family` saved at `path`, into fresh CPU tensors shaped like `like`.

    A `torch.save` file keeps each tensor's device: one written from CUDA tensors (Megatron-Core's queue saves what
    it was given) is mapped to the CPU, so that the check compares values, not devices.
    """
    if family == "torch":
        return torch.load(path, weights_only=True, map_location="cpu")
    if family == "format":  # a protocol adapter's own format (ckptspec/bench/adapter_peer.py), read by its loader
        template = {"model": {k: torch.zeros_like(t, device="cpu") for k, t in tensors(like).items()}, "step": 0}
        return checkpoint_format().load(path, template)
    out = {"model": {k: torch.empty_like(t, device="cpu") for k, t in tensors(like).items()}, "step": 0}
    dcp.load(out, checkpoint_id=path)
    return out


def saved_before_update(family: str, path: str, state_dict: dict) -> bool:
    """True if the checkpoint at `path` holds the values from before the last `negate_`, compared on the CPU
    whatever device the trainer's tensors are on."""
    loaded = load_checkpoint(family, path, state_dict)
    return all(torch.equal(loaded["model"][k].cpu(), -t.cpu()) for k, t in tensors(state_dict).items())


def random_bytes(n: int) -> memoryview:
    """n random bytes, for the raw write ceilings."""
    return torch.randint(0, 256, (n,), dtype=torch.uint8).numpy().data.cast("B")
