"""Workarounds for third-party bugs and gaps on the CPU-only stack these machines run, in one place.

Each module corrects one library at one version, says exactly what is wrong (file and line of the
library), is applied explicitly by its caller (nothing here runs on import), and is a no-op where
the library does not need it:

* ``vllm_cpu_fixes``: vLLM 0.32's CPU rejection sampler drops the expanded temperature, so sampled
  speculative decoding would not follow the target distribution (applied by the DGDS proposer and
  ``seer.dgds.vllm.worker``).
* ``megatron_cpu_shim``: megatron-core's tensor-parallel RNG tracker and rotary/attention code
  assume CUDA; the shim gives them the CPU generator and device (applied by
  ``seer.trainer.distributed``; it refuses to run where CUDA is available).
* ``megatron_moe_fixes``: megatron-core's MoE router names TransformerEngine's GEMM without
  importing it when TE is absent (applied by ``seer.trainer.model`` for MoE models).

They live apart from the code that uses them so that dropping one when the library is fixed is
deleting a module, not untangling it from Seer's own logic.
"""
