"""Dialects: one package per dialect. Importing this registers every op."""

from dialects import graph  # noqa: F401
