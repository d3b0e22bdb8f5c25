"""NaN poisoning of fresh PyTorch buffers: an output tile a kernel never writes shows up as NaN
instead of passing by luck (uninitialised memory is often zeros)."""
import contextlib

__all__ = ["poisoned_empty"]


@contextlib.contextmanager
def poisoned_empty():
    """Within the block, ``torch.empty`` / ``empty_like`` / ``Tensor.new_empty`` fill floating
    tensors with NaN."""
    import torch

    saved = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def poison(factory):
        def make(*args, **kwargs):
            t = factory(*args, **kwargs)
            if t.is_floating_point():
                with torch.no_grad():  # also for torch.empty(..., requires_grad=True)
                    t.fill_(float("nan"))
            return t
        return make

    torch.empty, torch.empty_like, torch.Tensor.new_empty = (poison(f) for f in saved)
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = saved
