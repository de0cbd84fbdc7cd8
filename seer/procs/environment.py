"""What of the driver's environment a process Seer launches inherits: an allow-list, not everything.

`seer-run`'s environment may hold secrets that are none of a server's business (`WANDB_API_KEY`, a
cloud token), and a server's `/proc/<pid>/environ` is one more place to leak them. A vLLM server,
the Mooncake and DGDS servers and a one-node Ray's head (so its workers) inherit only what their
runtimes read: the process basics, Python's, the thread and BLAS runtimes' (OpenMP, MKL), vLLM's,
torch's and the accelerators', Hugging Face's, gRPC's, Mooncake's and Seer's own `SEER_*`, but
never a run secret (`RUN_SECRETS`) even under those prefixes. What Seer itself hands a process (pool
and DGDS settings, Ray's own `RAY_*`) is added by the caller on top; a secret it hands one travels on
a pipe instead (seer.procs.GuardedProcess `secrets`), so no /proc/<pid>/environ ever shows it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

INHERITED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE",
    "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
    "VIRTUAL_ENV",
    "LD_PRELOAD", "LD_LIBRARY_PATH",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",  # a model or tokenizer fetched over TLS
})
INHERITED_PREFIXES = (
    "LC_",  # locale
    "PYTHON",  # PYTHONPATH, PYTHONHASHSEED, PYTHONUNBUFFERED, ...
    "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_", "CCL_", "I_MPI_",  # threads, BLAS, oneCCL
    "VLLM_", "TORCH", "PYTORCH_", "TRITON_",
    "CUDA_", "NVIDIA_", "NCCL_", "HIP_", "ROCR_", "GLOO_",  # accelerators and collectives (Ray sets CUDA_VISIBLE_DEVICES)
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_",
    "GRPC_",  # the DGDS server and its clients
    "MC_", "MOONCAKE_",  # the KV connector's transfer engine
    "SEER_",  # Seer's own plugins inside the server (seer.dgds.vllm, seer.compat)
)

# The run's secrets: the instances' key (vLLM's own variable) and the draft server's. A launched
# process gets them only as GuardedProcess `secrets`, and an agent never.
RUN_SECRETS = frozenset({"VLLM_API_KEY", "SEER_DGDS_TOKEN"})


def inherited(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The part of `environ` (default: this process's) that a launched process may see."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in INHERITED_NAMES or k.startswith(INHERITED_PREFIXES)) and k not in RUN_SECRETS}


# A user's agent (seer.rollout.agents) is code Seer runs but does not own: it gets less than a
# server does. No SEER_* (SEER_DGDS_TOKEN is a run secret), no VLLM_* (VLLM_API_KEY guards the
# instances' weight loading), no HF_* (HF_TOKEN), no runtime tuning it has no use for; only what
# a program needs to start (the basics, Python's, the locale, TLS roots). What an agent is meant
# to see (its gateway URL and key, its record) is added by the runner; further names only when
# the run's config names them (agent.inherit_env).
AGENT_INHERITED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "LANG", "LANGUAGE",
    "TMPDIR", "TMP", "TEMP", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
    "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
})
AGENT_INHERITED_PREFIXES = ("LC_",)


def agent_inherited(extra_names: tuple[str, ...] = (), environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The part of `environ` (default: this process's) a user's agent may see: the basics above
    and the names the config lists (`extra_names`), nothing else."""
    environ = os.environ if environ is None else environ
    names = AGENT_INHERITED_NAMES | set(extra_names)
    return {k: v for k, v in environ.items()
            if (k in names or k.startswith(AGENT_INHERITED_PREFIXES)) and k not in RUN_SECRETS}
