"""Which classes a local checkpoint part may hold, decided without running its pickle (IN-4).

A part is ``torch.save`` of a TensorAwareStateDict and loads with ``torch.load(weights_only=True)``. Besides what
torch allows anyway (tensors, plain containers, dtypes, devices), a part may hold:

* the classes in ``SAFE_GLOBALS`` and those the user allows with ``torch.serialization.add_safe_globals``;
* a subclass of ``TensorAwareStateDict`` (the documented extension point: the program's own state-dict class)
  whose module is already imported in the loading process. Its module is never imported on behalf of a file
  (an import runs code), and the name must lead to that very class through the module's and the classes'
  own attributes, read without running any code.

Every other global is refused, all of them named, with the file. The globals are read from the pickle with
``torch.serialization.get_unsafe_globals_in_checkpoint`` (a static disassembly) before anything is unpickled, and
only the classes so resolved are allowed to the load.

The same decision is taken at ``save()`` on the part as it would be written (``torch.save`` under ``skip_data``
into a sparse temporary file: the pickle, no tensor bytes): a part that ``load()`` would refuse, or one that
cannot be pickled at all (a class defined inside a function), is refused at save, when the program can still be
fixed, not at load after a crash. A TensorAwareStateDict class defined in ``__main__`` is logged at save: only a
program whose ``__main__`` defines it (the same script, restarted) can load it.
"""

from __future__ import annotations

import io
import logging
import pickle
import sys
import tempfile
from collections.abc import Iterable
from typing import IO, Any, cast

import torch

from ..base_state_dict import TensorAwareStateDict
from ..basic_state_dict import BasicTensorAwareStateDict, TensorPlaceholder
from .base_manager import CheckpointingException

__all__ = ["SAFE_GLOBALS", "check_loadable", "load_part"]

logger = logging.getLogger(__name__)

SAFE_GLOBALS: list[type[Any]] = [BasicTensorAwareStateDict, TensorPlaceholder, bytes]
"""Classes a part may hold besides what ``torch.load(weights_only=True)`` allows anyway (``bytes``: pickle
protocol 2 rebuilds an empty bytes value by calling it)."""

_WARNED: set[type] = set()  # __main__ classes already logged (once each, not at every save)
_HOW = (
    "a class of your own that a part holds must be allowed with torch.serialization.add_safe_globals in the program "
    "that saves and in the one that loads (a TensorAwareStateDict subclass is allowed once its module is imported)"
)


def _static_attr(owner: object, name: str) -> object | None:
    """``owner.name`` as stored in its ``__dict__`` (no ``__getattr__``, no descriptor runs), or None."""
    return vars(owner).get(name) if hasattr(owner, "__dict__") else None


def _resolve(dotted: str) -> object | None:
    """The object a pickle global ``module.qualname`` names, from modules already imported only, or None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj: object | None = module
        for name in parts[cut:]:
            obj = _static_attr(obj, name)
            if obj is None:
                return None
        return obj
    return None


def _state_dict_class(dotted: str) -> type | None:
    """The TensorAwareStateDict subclass ``dotted`` names in this process, or None (see the module docstring)."""
    cls = _resolve(dotted)
    if not isinstance(cls, type) or TensorAwareStateDict not in cls.__mro__:
        return None
    return cls if f"{cls.__module__}.{cls.__qualname__}" == dotted else None


def _why_refused(dotted: str) -> str:
    module = dotted.rsplit(".", 1)[0]
    if dotted == "builtins.getattr":
        return f"{dotted} (how pickle refers to a class nested in another class: define the class at module level)"
    if module == "__main__":
        return f"{dotted} (a class of the __main__ of the program that saved it; this program's __main__ has none)"
    if module not in sys.modules:
        return f"{dotted} (if it is a TensorAwareStateDict subclass, import {module} before load())"
    return dotted


def allowed_classes(unsafe: Iterable[str]) -> tuple[list[type[Any]], list[str]]:
    """(the TensorAwareStateDict classes among ``unsafe`` global names, the other names, each with why)."""
    allowed, refused = [], []
    for dotted in sorted(set(unsafe)):
        cls = _state_dict_class(dotted)
        if cls is None:
            refused.append(_why_refused(dotted))
        else:
            allowed.append(cls)
    return allowed, refused


def _unsafe_globals(f: IO[bytes]) -> list[str]:
    """The globals of the torch.save file ``f`` that torch, ``SAFE_GLOBALS`` and the user do not allow."""
    with torch.serialization.safe_globals([*SAFE_GLOBALS]):
        return torch.serialization.get_unsafe_globals_in_checkpoint(f)


def load_part(body: memoryview | bytes, where: str) -> TensorAwareStateDict:
    """Unpickle a part's ``torch.save`` bytes under the rules above; ``CheckpointingException`` naming ``where``
    and every refused global if it holds one (nothing of it is unpickled then)."""
    try:
        allowed, refused = allowed_classes(_unsafe_globals(io.BytesIO(body)))
    except (ValueError, RuntimeError, EOFError) as exc:
        raise CheckpointingException(f"{where} is not a torch.save file: {exc}") from None
    if refused:
        raise CheckpointingException(
            f"{where} holds objects that are not allowed to load: {', '.join(refused)}; {_HOW}"
        )
    try:
        with torch.serialization.safe_globals([*SAFE_GLOBALS, *allowed]):
            return cast(TensorAwareStateDict, torch.load(io.BytesIO(body), weights_only=True))
    except pickle.UnpicklingError as exc:
        raise CheckpointingException(f"{where} holds objects that are not allowed to load: {exc}; {_HOW}") from None


def check_loadable(part: TensorAwareStateDict) -> None:
    """Raise ``CheckpointingException`` if ``part``, once saved, could not be loaded by ``load_part``."""
    with tempfile.TemporaryFile() as f:
        try:
            with torch.serialization.skip_data():
                torch.save(part, f)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise CheckpointingException(
                f"{type(part).__qualname__} cannot be saved so that it loads again: {exc} (a class defined inside a "
                "function can never be loaded: define it at module level)"
            ) from None
        f.seek(0)
        _, refused = allowed_classes(_unsafe_globals(f))
    if refused:
        raise CheckpointingException(f"load() would refuse this state dict: it holds {', '.join(refused)}; {_HOW}")
    if type(part).__module__ == "__main__" and type(part) not in _WARNED:
        _WARNED.add(type(part))
        logger.warning(
            "%s is defined in __main__: only a program whose __main__ defines it (this script, restarted) can load "
            "these local checkpoints; define it in an importable module to load them elsewhere",
            type(part).__qualname__,
        )
