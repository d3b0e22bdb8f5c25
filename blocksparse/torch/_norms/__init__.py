"""PyTorch glue of the norms family: custom ops (:mod:`.ops`), Triton launchers (:mod:`.launch`),
the reference path (:mod:`.reference`)."""
