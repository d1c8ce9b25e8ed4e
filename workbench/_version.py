"""The version of workbench, in one place: the package, the checkpoints it writes and its build read it
here."""

__version__ = "0.1.0"
