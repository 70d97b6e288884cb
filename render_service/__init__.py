"""render-service: a torch-free, drop-in replacement for vLLM's render tier."""

__version__ = "0.1.0"

# The vLLM release this service is a drop-in for: the goldens under tests/parity/ were recorded
# from its `vllm launch render`, `/version` reports it, and the audit compares engines against it.
VLLM_VERSION = "0.33.0"
