"""AR-5: a frozen AsyncRequest gains finalize functions added to the original afterwards.

AsyncRequest.freeze() is documented as "disallowing adding new finalization functions"; in NVRx 0.4.1 and 0.7.0
and Megatron-Core 0.16.1 and 0.19.2 it is `self._replace(is_frozen=True)`, a shallow copy whose `finalize_fns` is the original's
list, so `add_finalize_fn` on the original also changes the frozen (scheduled) request.

    python AR-5.py nvidia_resiliency_ext | megatron.core | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common


def main() -> None:
    core = _common.module("async_ckpt.core")
    original = core.AsyncRequest(None, (), [print])
    frozen = original.freeze()
    original.add_finalize_fn(repr)
    seen = list(frozen.finalize_fns)
    _common.verdict(seen != [print], f"after add_finalize_fn(repr) on the original, frozen.finalize_fns is {seen}")


if __name__ == "__main__":
    main()
