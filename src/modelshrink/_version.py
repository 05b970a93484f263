"""The version of modelshrink, written once: pyproject.toml reads it (`[tool.setuptools.dynamic]`), the package
re-exports it, and the manifests and model cards record it. A leaf, so low modules import it without the facade."""

__version__ = "0.1.0"
