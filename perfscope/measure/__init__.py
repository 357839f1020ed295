"""The trial runner of ``perfscope tune`` and its record protocol.

``python -m perfscope.measure`` (:mod:`.runner`) runs an unmodified script in-process, as
``perfscope profile`` does (it uses the collection layer to run it and find its steps), and times
its steps: a warm-up that drains the DataLoader's prefetch (:mod:`.warmup`), a steady-state
measured window (:mod:`.window`), facts about the run (:mod:`.facts`), the step losses
(:mod:`.losses`). It writes one JSON line per step and a result file per rank; :mod:`.records`
reads them back for the tuner. Writer and reader of the protocol live here, together.
"""
