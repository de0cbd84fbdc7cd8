"""vLLM worker extension: load new policy weights in place and report their version.

Loaded inside each vLLM worker via `--worker-extension-cls seer.rollout.weight_ext.SeerWeightExtension`
and called through the server's `/collective_rpc` (dev mode). Strict on-policy RL needs two
things from an instance: the new weights, and an answer to "which weights are you serving?".
Keep this module light: it is imported in every worker process.
"""

from __future__ import annotations


class SeerWeightExtension:
    """Mixed into vLLM's Worker class; `self.model_runner` is the worker's runner."""

    def seer_load_weights(self, path: str, version: str) -> str:
        """Read HF safetensors from `path` into the running model; returns the version now served."""
        from pathlib import Path

        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        # vLLM's in-place reload redoes the post-load processing (CPU backends repack linear
        # weights, so writing into the loaded parameters directly would not work).
        tensors = {}
        for f in files:
            tensors.update(load_file(str(f)))
        self.reload_weights(weights_iterator=iter(tensors.items()))
        self._seer_weight_version = int(version)
        return str(self._seer_weight_version)

    def seer_weight_version(self) -> str:
        return str(getattr(self, "_seer_weight_version", 0))
