"""perfscope's configuration search, guided by the profile's verdict: ``perfscope tune``.

The flow: :mod:`perfscope.tuner.tune` (the steps) runs a :mod:`perfscope.tuner.study` whose trials
(:mod:`perfscope.tuner.trial`) measure the script in its own process, then proves the winner
(:mod:`perfscope.tuner.prove`, :mod:`perfscope.tuner.confirm`). :mod:`perfscope.tuner.options` holds what the command is
asked, and imports neither Optuna nor torch; the rest needs the ``tune`` extra.
"""
