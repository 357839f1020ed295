"""Process supervision shared by collection, analysis and the tuner: the keeper that ends a whole
process tree (:mod:`perfscope.process.keeper`), process groups and the environment of perfscope's
own children (:mod:`perfscope.process.group`). Imports nothing else of perfscope's packages."""
