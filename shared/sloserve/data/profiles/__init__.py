"""Vendored Vidur operator profiles (MIT, Microsoft); see README.md here."""
