"""The embedded acceleration runtime: ``perfscope.accelerate(model, optimizer, loader, config=...)``
applies a configuration (input pipeline, precision, data parallel, accumulation) to a training loop.

``perfscope.runtime.config`` needs no torch; the other modules import it.
"""
