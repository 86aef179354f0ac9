"""A counter of torch.distributed.all_reduce calls, for test_queue.py's clauses on what a poll costs."""

import torch.distributed as dist

__all__ = ["CollectiveCounter"]


class CollectiveCounter:
    """Counts calls of torch.distributed.all_reduce (and the element counts) while active."""

    def __init__(self):
        self.calls, self._real = [], dist.all_reduce

    def __enter__(self):
        def counting(tensor, *args, **kwargs):
            self.calls.append(tensor.numel())
            return self._real(tensor, *args, **kwargs)

        dist.all_reduce = counting
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._real
