"""The goodput benchmark's training workload: a small MLP stack with Adam, sized by the bytes of its state.

    trainer = Trainer(nbytes, device)    # parameters + Adam's two moments: about nbytes
    trainer.step(before_update)          # forward, backward, before_update(), optimizer step (in place)
    trainer.state_dict()                 # the live tensors, no copies: what a save has to snapshot
    fingerprint = trainer.fingerprint()  # a few elements of every tensor, taken at the save
    wrong = mismatches(load(family, path, trainer), fingerprint)   # [] if the checkpoint holds that state

The state dict is flat, by name, as a trainer's `get_state_dict` hands it to DCP: `model` (the parameters),
`optim` (Adam's `exp_avg` and `exp_avg_sq` of each parameter, named after it) and `step`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from ckptspec.spec.harness.surface.loading import checkpoint_format

__all__ = ["Trainer", "load", "mismatches"]

BLOCKS = 4
BATCH = 32
SAMPLES = 256  # elements of each tensor in a fingerprint, evenly spaced, first and last included


def _block(width: int) -> nn.Module:
    """A transformer's MLP block (pre-norm, 4x expansion); residual added by Trainer."""
    return nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


class Trainer:
    """BLOCKS MLP blocks of a width chosen so that parameters + exp_avg + exp_avg_sq come to about `nbytes`."""

    def __init__(self, nbytes: int, device: str = "cpu", seed: int = 0):
        # 8 w^2 weights per block, three float32 copies of each (parameter and two moments).
        width = max(8, 8 * round(math.sqrt(nbytes / (BLOCKS * 8 * 3 * 4)) / 8))
        generator = torch.Generator(device).manual_seed(seed)
        with torch.random.fork_rng(devices=[]):  # the initial weights, without touching the global generator
            torch.manual_seed(seed)
            self.blocks = nn.ModuleList(_block(width) for _ in range(BLOCKS)).to(device)
        self.inputs = torch.randn(BATCH, width, generator=generator, device=device)
        self.targets = torch.randn(BATCH, width, generator=generator, device=device)
        # Fused: one pass over each tensor, as a tuned trainer runs it (CPU and CUDA since torch 2.4).
        self.optimizer = torch.optim.Adam(self.blocks.parameters(), lr=1e-3, fused=True)
        self.names: dict[torch.Tensor, str] = {p: name for name, p in self.blocks.named_parameters()}
        self.steps = 0
        self._picks: dict[str, torch.Tensor] = {}
        self.step()  # creates Adam's moments, so every save holds the same tensors

    def step(self, before_update: Callable[[], None] | None = None) -> None:
        """One training step: every parameter and both of its moments change, in place, after
        `before_update()` (where a trainer waits for a save's background staging)."""
        out = self.inputs
        for block in self.blocks:
            out = out + block(out)
        loss = nn.functional.mse_loss(out, self.targets)
        loss.backward()
        if before_update is not None:
            before_update()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1

    def state_dict(self) -> dict:
        """The live state: the trainer's own tensors (a save that does not snapshot them sees later steps)."""
        optim = {}
        for p, state in self.optimizer.state.items():
            for key in ("exp_avg", "exp_avg_sq"):
                optim[f"{self.names[p]}.{key}"] = state[key]
        model = {name: p.detach() for name, p in self.blocks.named_parameters()}
        return {"model": model, "optim": optim, "step": self.steps}

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self.state_dict()).values())

    def fingerprint(self) -> dict:
        """SAMPLES evenly spaced elements of every tensor (CPU copies), and the step: cheap enough to take at
        every save without changing what is timed, and enough to tell one step's state from another's
        (Adam moves every element each step)."""
        out: dict = {"step": self.steps}
        for name, t in _tensors(self.state_dict()).items():
            if name not in self._picks:
                n = t.numel()
                self._picks[name] = torch.linspace(0, n - 1, min(SAMPLES, n), device=t.device).long()
            out[name] = t.detach().reshape(-1).index_select(0, self._picks[name]).cpu()
        return out

    def positions(self, name: str) -> torch.Tensor:
        return self._picks[name].cpu()


def _tensors(state_dict: dict) -> dict[str, torch.Tensor]:
    return {f"{group}/{name}": t for group in ("model", "optim") for name, t in state_dict[group].items()}


def load(family: str, path: str, trainer: Trainer) -> dict:
    """What a peer of `family` saved at `path`, loaded into fresh CPU tensors (`torch.load` or `dcp.load`)."""
    if family == "torch":
        return torch.load(path, weights_only=True, map_location="cpu")
    live = trainer.state_dict()
    out: dict = {
        group: {k: torch.empty_like(t, device="cpu") for k, t in live[group].items()} for group in ("model", "optim")
    }
    out["step"] = -1
    if family == "format":  # a protocol adapter's own format (ckptspec/bench/adapter_peer.py), read by its loader
        return checkpoint_format().load(path, out)
    dcp.load(out, checkpoint_id=path)
    return out


def mismatches(loaded: dict, fingerprint: dict, trainer: Trainer) -> list[str]:
    """Names whose sampled elements differ from the fingerprint (`step` if the step does), [] if none."""
    wrong = [] if loaded.get("step") == fingerprint["step"] else ["step"]
    tensors = _tensors(loaded)
    for name, expected in fingerprint.items():
        if name == "step":
            continue
        t = tensors.get(name)
        if t is None or not torch.equal(t.reshape(-1).index_select(0, trainer.positions(name)), expected):
            wrong.append(name)
    return wrong
