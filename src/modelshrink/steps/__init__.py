"""The library function behind each command, one module a step. Each takes its options object (from
`modelshrink.options`) and an output path and writes one artifact; `modelshrink` exports them by the
commands' names (see its docstring)."""
