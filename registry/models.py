"""Chip registry: organisations, keys, facilities, chip models, chips (issue 3)."""
