"""Generation at fixed shapes: a preallocated-cache decoder step and a beam search made of tensor updates,
captured in CUDA graphs on a GPU (see runner.py). transformers' generate stays the reference: the same
token ids, faster where kernel launches and Python bound the loop."""

from modelshrink.generation.static.runner import StaticSearch, why_not

__all__ = ["StaticSearch", "why_not"]
