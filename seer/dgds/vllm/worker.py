"""Optional vLLM worker classes that hand the model runner to the DGDS proposer explicitly.

The proposer finds its runner on its own (``seer.dgds.vllm.proposer._calling_runner``); these
classes exist for deployments that would rather not rely on that, or whose vLLM build calls the
proposer from somewhere else. Use ``--worker-cls seer.dgds.vllm.worker.DgdsCPUWorker`` (CPU
backend) or ``seer.dgds.vllm.worker.DgdsGPUWorker`` (CUDA backend). Each is resolved lazily, so
importing this module never imports the other backend's worker. Both apply
``seer.compat.vllm_cpu_fixes`` (vLLM 0.32's CPU rejection sampler bug), whatever the proposer.
"""

from __future__ import annotations

from typing import Any


def _bind(worker: Any) -> None:
    runner = getattr(worker, "model_runner", None)
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "bind_runner"):
        drafter.bind_runner(runner)


def _worker_class(base: type) -> type:
    class _DgdsWorker(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            from seer.compat.vllm_cpu_fixes import apply_cpu_sampling_fixes

            apply_cpu_sampling_fixes()  # also for other speculative methods (ngram, suffix, ...)
            super().__init__(*args, **kwargs)

        def load_model(self, *args: Any, **kwargs: Any) -> Any:
            result = super().load_model(*args, **kwargs)
            _bind(self)
            return result

    _DgdsWorker.__name__ = f"Dgds{base.__name__}"
    _DgdsWorker.__qualname__ = _DgdsWorker.__name__
    _DgdsWorker.__module__ = __name__
    return _DgdsWorker


def __getattr__(name: str) -> type:
    if name == "DgdsCPUWorker":
        from vllm.v1.worker.cpu_worker import CPUWorker

        cls = _worker_class(CPUWorker)
    elif name == "DgdsGPUWorker":
        from vllm.v1.worker.gpu_worker import Worker

        cls = _worker_class(Worker)
    else:
        raise AttributeError(name)
    cls.__name__ = cls.__qualname__ = name
    globals()[name] = cls
    return cls
