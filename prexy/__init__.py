"""Prexy: a streaming, rewriting reverse proxy built on Twisted."""

__version__ = "0.1.0"
