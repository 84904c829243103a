"""Vendored data files (read with ``importlib.resources``); see each folder's README."""
