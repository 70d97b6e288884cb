"""Examples run as modules from the repository root: `python -m examples.pd_flow`."""
