"""Vendored request traces (gzip-compressed CSV); sources and licences in README.md."""
