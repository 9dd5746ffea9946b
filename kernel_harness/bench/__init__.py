"""The benchmark behind ``scripts/benchmark_cpu.py``.

One module per job:

* :mod:`.protocol` - length-prefixed pickle messages over pipes, with deadlines;
* :mod:`.worker` - the child process that imports and runs the kernel (or the
  baseline); it never sees a reference output;
* :mod:`.process` - the parent's handle on a worker: start, request, kill on
  timeout, name the signal of a crash;
* :mod:`.tree` - tuple/list/dict trees of tensors: clone, overlap, bytes;
* :mod:`.stats` - timing statistics (like ``torch.utils.benchmark``'s
  ``Measurement``) and the speedup's confidence interval;
* :mod:`.trace` - the ATen ops a call dispatches, and the delegation flag;
* :mod:`.pinning` - whether the run is NUMA-pinned (``numactl``);
* :mod:`.options` - what a run is asked (``BenchOptions``) and found (``BenchResult``);
* :mod:`.session` - one run's shared state and the parent's side of its workers;
* :mod:`.checking` - input sets, correctness calls, verified timed calls, delegation;
* :mod:`.timing` - warm-up, calibration and the interleaved timing rounds;
* :mod:`.conditions` - what the run saw of its machine (CPU/wall per worker, run
  queue, steal) and whether it is ``reliable``;
* :mod:`.against` - ``--against``: the ratio to another build timed in the same rounds;
* :mod:`.sweep` - ``--tier all``: every tier timed, the dispatcher's pick checked;
* :mod:`.throughput` - GB/s and GFLOP/s against the machine's measured limits;
* :mod:`.runner` - validates the options and runs the phases in order;
* :mod:`.report` - the rich output and the JSON record.
"""
