"""Seer: synchronous, strictly on-policy RL rollout without the long tail."""

__version__ = "0.1.0"
