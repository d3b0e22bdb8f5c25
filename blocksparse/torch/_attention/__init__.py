"""PyTorch glue of the fused attention family: custom ops (:mod:`.ops`), layout handles and device
tables (:mod:`.state`), Triton launchers (:mod:`.launch`), the reference path (:mod:`.reference`)."""
