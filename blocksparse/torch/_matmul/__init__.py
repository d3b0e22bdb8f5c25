"""PyTorch glue of the matmul family: custom ops (:mod:`.ops`), layout handles and launch plans
(:mod:`.plan`), Triton launchers (:mod:`.launch`), the reference path (:mod:`.reference`)."""
