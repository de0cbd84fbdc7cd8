"""Ground layer: launching and guarding processes, and where they run (ports, cores, GPUs)."""

from seer.procs.devices import cpu_sets, cuda_devices, free_port, gpu_sets, intel_openmp_library, port_open
from seer.procs.process import GuardedProcess, remote_error_line

__all__ = ["GuardedProcess", "cpu_sets", "cuda_devices", "free_port", "gpu_sets", "intel_openmp_library", "port_open",
           "remote_error_line"]
