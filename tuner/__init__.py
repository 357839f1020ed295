"""perfscope's configuration search, guided by the profile's verdict: ``perfscope tune``.

The flow: :mod:`tuner.tune` (the steps) runs a :mod:`tuner.study` whose trials
(:mod:`tuner.trial`) measure the script in its own process, then proves the winner
(:mod:`tuner.prove`, :mod:`tuner.confirm`). :mod:`tuner.options` holds what the command is
asked, and imports neither Optuna nor torch; the rest needs the ``tune`` extra.
"""
