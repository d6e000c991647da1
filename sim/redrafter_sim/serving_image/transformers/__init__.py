# TEST DOUBLE: the emulated serving image has no transformers. Never used in production.
"""Absent from the emulated serving image, as torch is (why, and how serving processes find this: ../torch)."""

raise ModuleNotFoundError("No module named 'transformers' (not in the emulated serving image)", name="transformers")
