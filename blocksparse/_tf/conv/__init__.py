"""TensorFlow glue of the convolution family (private).

:mod:`.params`    the filter (any accepted form -> flat; the dense masked filter; grouped weights),
                  weight normalisation, the edge bias image
:mod:`.compute`   the dense and grouped paths (TensorFlow ops only; gradients by autodiff), and
                  which one serves a call
"""
