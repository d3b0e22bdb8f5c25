"""PyTorch glue of the transformer family: custom ops (:mod:`.ops`), layout handles and device
tables (:mod:`.state`), Triton launchers (:mod:`.launch`), the reference path (:mod:`.reference`)."""
