"""The trainer's errors, importable without torch, Megatron or Ray (the CLI catches them)."""


class TrainerGroupError(RuntimeError):
    """A rank could not be placed or started, or failed (or was lost) during a call."""
