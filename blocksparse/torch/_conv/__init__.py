"""PyTorch glue of the convolution family: index tables per device (:mod:`.tables`), the dense and
grouped paths and the choice between them (:mod:`.compute`).  Both paths are PyTorch ops only, so
autograd, autocast and ``torch.compile(fullgraph=True)`` handle them as they are."""
