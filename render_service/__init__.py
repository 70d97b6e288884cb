"""render-service: a torch-free, drop-in replacement for vLLM's render tier."""

__version__ = "0.1.0"
