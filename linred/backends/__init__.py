"""Backends: one module each, imported on first use through :mod:`linred.backends.registry`."""
