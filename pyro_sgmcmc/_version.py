"""The package's version: the one place it is written (``pyproject.toml`` reads it, through
hatchling's ``[tool.hatch.version]``)."""

__version__ = "0.4.0"
