"""perfscope's configuration search, guided by the profile's verdict.

So far it holds :mod:`tuner.confirm`: re-measuring a candidate interleaved with the baseline and
calling it faster only beyond the measured noise. Its statistics need ``scipy`` (the ``tune``
extra).
"""
