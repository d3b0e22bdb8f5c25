"""PyTorch glue of the LSTM family: custom ops (:mod:`.ops`), Triton launchers (:mod:`.launch`),
the reference path (:mod:`.reference`)."""
