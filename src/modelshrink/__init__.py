"""modelshrink: make transformer models small and fast while keeping their quality."""

__version__ = "0.1.0"
