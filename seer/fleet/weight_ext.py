"""vLLM worker extension: load new policy weights in place and report their version.

Loaded inside each vLLM worker via `--worker-extension-cls seer.fleet.weight_ext.SeerWeightExtension`
and called through the server's `/collective_rpc` (dev mode). Strict on-policy RL needs two
things from an instance: the new weights, and an answer to "which weights are you serving?".
Keep this module light: it is imported in every worker process.

CPU backend caveat (vLLM 0.32): `process_weights_after_loading` packs every 2-D linear weight
into a closure `layer.cpu_linear` (oneDNN handle / sgl-kernel packed copy), and the forward pass
uses that packed copy, not `layer.weight`. vLLM's layerwise in-place reload re-runs that packing
only for layers that received checkpoint tensors. A tied `lm_head` (tie_word_embeddings) never
does -- the loader skips `lm_head.*` and the new values reach it only through the parameter it
shares with `embed_tokens` -- so it kept computing logits with the OLD embedding matrix. We
snapshot the packed closures before the reload and re-pack every layer whose closure survived.

MoE experts (vLLM 0.32 CPU, e.g. Qwen3-MoE): the first load prepacks every expert's weights into
the CPU grouped-GEMM layout (`fused_moe/experts/cpu_moe.py` `process_weights_after_loading`:
`cpu_prepack_moe_weight`), but on a weight update `UnquantizedFusedMoEMethod._setup_kernel`
(`unquantized_fused_moe_method.py` ~187-205) only copies the new, unpacked weights into the
existing storage and skips the experts' prepack, so the kernel read unpacked weights as packed
ones (garbage, neither the old policy nor the new). We prepack them after the reload.
"""

from __future__ import annotations


def _cpu_gemm_closures(model) -> dict:
    """{module: its current `cpu_linear`} for every module the CPU GEMM dispatch has packed."""
    return {m: m.__dict__["cpu_linear"] for m in model.modules() if "cpu_linear" in m.__dict__}


def _repack_stale_cpu_gemms(model, before: dict) -> list[str]:
    """Re-pack the layers whose packed weights the reload did not refresh; returns their names."""
    import torch

    repacked, stale = [], []
    with torch.no_grad():
        for name, module in model.named_modules():
            old = before.get(module)
            if old is None or module.__dict__.get("cpu_linear") is not old:
                continue  # not a packed layer, or the reload already re-packed it
            weight = getattr(module, "weight", None)
            quant_method = getattr(module, "quant_method", None)
            if weight is None or weight.is_meta or weight.ndim != 2 or weight.numel() == 0 or quant_method is None:
                # the unpacked weight was dropped after packing (remove_weight=True), and the
                # checkpoint had nothing for this layer: it would keep serving the old weights
                stale.append(name)
                continue
            # e.g. a tied lm_head: `weight` already holds the new values, only the pack is old
            quant_method.process_weights_after_loading(module)
            repacked.append(name)
    if stale:
        raise RuntimeError(
            f"in-place weight reload left layers with their old packed CPU weights: {stale} "
            "(the checkpoint has no tensors for them?)"
        )
    return repacked


def _repack_cpu_moe_experts(model) -> list[str]:
    """Redo the CPU experts' prepack that vLLM skips on a weight update; returns the layers' names."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without the CPU MoE experts has nothing to repack
        return []
    repacked = []
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts) or experts._use_zentorch:
            continue
        config = experts.moe_config
        if experts._padded_intermediate_size(config) != config.intermediate_size_per_partition:
            # the update copied unpadded weights into padded storage: repacking cannot repair that
            raise NotImplementedError(f"{name}: in-place reload of CPU MoE experts whose intermediate size "
                                      f"{config.intermediate_size_per_partition} vLLM pads is not supported")
        experts.process_weights_after_loading(module)  # pad (a no-op here) and prepack w13 / w2
        repacked.append(name)
    return repacked


class SeerWeightExtension:
    """Mixed into vLLM's Worker class; `self.model_runner` is the worker's runner."""

    def seer_load_weights(self, path: str, version: str, manifest_json: str = "") -> str:
        """Read HF safetensors from `path` into the running model; returns the version now served.

        With a manifest (JSON of [name, size, sha256] per file) every file is checked first: a
        mismatch raises (seer.fleet.weight_files.WeightsMismatch, naming the file, what was
        expected and what was found) before anything is applied, so the worker keeps serving
        its old weights under its old version."""
        from pathlib import Path

        from safetensors.torch import load_file
        from vllm.platforms import current_platform

        from seer.fleet.weight_files import check_dir, parse_manifest

        manifest = parse_manifest(manifest_json)
        if manifest:
            check_dir(path, manifest)
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        tensors = {}
        for f in files:
            tensors.update(load_file(str(f)))
        version_now = int(version)
        # vLLM's in-place reload redoes the post-load processing (CPU backends repack linear
        # weights, so writing into the loaded parameters directly would not work) ...
        model = self.model_runner.get_model()
        before = _cpu_gemm_closures(model) if current_platform.is_cpu() else {}
        self._seer_weight_version = -1  # mid-update: serve no version until the reload finished
        self.reload_weights(weights_iterator=iter(tensors.items()))
        # ... but only for layers that received tensors; re-pack the others (tied lm_head).
        if before:
            _repack_stale_cpu_gemms(model, before)
        if current_platform.is_cpu():
            _repack_cpu_moe_experts(model)
        self._seer_weight_version = version_now
        return str(self._seer_weight_version)

    def seer_weight_version(self) -> str:
        return str(getattr(self, "_seer_weight_version", 0))

    # ---- routing capture for routing replay (seer.fleet.routing_ext; off unless enabled) ----
    def seer_routing_enable(self, cap_bytes: str = "0") -> str:
        """Start recording every MoE layer's top-k experts per computed token; returns the
        recorder's header (layers, top_k, dtype, num_experts) as JSON. Only the first rank records
        (tensor-parallel ranks route alike)."""
        from seer.fleet import routing_ext

        if getattr(self, "rank", 0) != 0:
            return ""
        return routing_ext.enable(self, int(cap_bytes) or routing_ext.DEFAULT_CAP_BYTES)

    def seer_routing_take(self, ids_json: str) -> str:
        """Pop the recorded rows of the given caller request ids (JSON list); JSON answer."""
        from seer.fleet import routing_ext

        return "" if getattr(self, "rank", 0) != 0 else routing_ext.take(self, ids_json)

    def seer_routing_stats(self) -> str:
        from seer.fleet import routing_ext

        return "" if getattr(self, "rank", 0) != 0 else routing_ext.stats(self)
