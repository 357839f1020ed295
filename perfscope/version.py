"""perfscope's version: one definition, read by the package, the records it writes and ``--version``."""

__version__ = "0.1.0"
