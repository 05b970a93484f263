"""Pure metric functions for `modelshrink eval`: ROUGE, summary style, GLUE metrics, significance."""
