"""Each instance gets its own share of the machine: cores on CPU, GPUs on a GPU node (pure functions)."""

import pytest

from seer.procs.guard import parse_cpus
from seer.procs import cpu_sets, gpu_sets


def test_cores_and_gpus_are_split_evenly_and_disjointly():
    assert cpu_sets(2, [0, 1, 2, 3]) == ["0,1", "2,3"]
    assert cpu_sets(3, [5, 1, 3]) == ["1", "3", "5"]
    assert gpu_sets(2, list(range(8))) == ["0,1,2,3", "4,5,6,7"]  # TP4 per instance
    assert gpu_sets(3, list(range(8))) == ["0,1", "2,3", "4,5"]  # never a GPU shared by two instances


def test_more_instances_than_devices_is_a_clear_error():
    with pytest.raises(ValueError, match="instances.count=3 needs at least one GPU each, but only 2 are usable"):
        gpu_sets(3, [0, 1])
    with pytest.raises(ValueError, match="at least one CPU core each"):
        cpu_sets(3, [0, 1])


def test_the_guard_reads_the_core_lists_cpu_sets_writes():
    assert parse_cpus("0") == {0}
    assert parse_cpus("2-3") == {2, 3}
    assert parse_cpus("0,2-4") == {0, 2, 3, 4}
    for bad in ("", "a", "1-", "1,,2"):
        with pytest.raises(ValueError, match="bad CPU list"):
            parse_cpus(bad)
