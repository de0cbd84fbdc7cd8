"""Layer 2: what runs on machines for a run — vLLM instances, their KV pool and DGDS service.

`Fleet` (seer.fleet.fleet) is the one object the loop talks to. `seer.fleet.config` is light
(the run config imports it); everything else loads vLLM-facing code, so it is imported lazily.
"""


def __getattr__(name: str):
    if name in ("Fleet", "FleetError", "LaunchSettings", "Dropped"):
        from seer.fleet import fleet

        return getattr(fleet, name)
    raise AttributeError(f"module 'seer.fleet' has no attribute {name!r}")
