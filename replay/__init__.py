"""Deterministic training replay (pure PyTorch, never Django). See DESIGN §6."""
