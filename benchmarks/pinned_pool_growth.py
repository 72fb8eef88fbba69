"""
Growth of a pool of pinned host memory, with and without a maximum, and cudaHostAlloc alone (rmm 26.10).

``python -m benchmarks.pinned_pool_growth`` on a machine with a GPU: twenty 200 MB buffers from a fresh
``PoolMemoryResource`` over ``PinnedHostMemoryResource`` with ``maximum_pool_size`` of 64 GiB (``max-pool``),
then from one with no maximum under a ``LimitingResourceAdaptor`` of 64 GiB (``limiting-pool``): seconds to make
the pool (1 GiB), each allocation's seconds, their sum and the pool's size. Then the second kind under a 3 GiB
limit until an allocation fails, and ``cudaHostAlloc`` of 1, 4 and 16 GiB alone. Pins up to about 35 GB of
host memory.
"""

import time
import rmm
import rmm.mr

GiB = 2**30


def run(name, make, n=20, size=200_000_000):
    t = time.perf_counter(); pool = make(); t0 = time.perf_counter() - t
    times, bufs = [], []
    for _ in range(n):
        t = time.perf_counter(); bufs.append(rmm.DeviceBuffer(size=size, mr=pool)); times.append(time.perf_counter() - t)
    print(name, f"create {t0:.3f}s allocs", [round(x, 3) for x in times], f"sum {sum(times):.3f}s pool {pool.pool_size():,}",
          flush=True)
    del bufs, pool


limit = 64 * GiB
pinned = rmm.mr.PinnedHostMemoryResource
run("max-pool", lambda: rmm.mr.PoolMemoryResource(pinned(), initial_pool_size=GiB, maximum_pool_size=limit))
run("limiting-pool", lambda: rmm.mr.PoolMemoryResource(rmm.mr.LimitingResourceAdaptor(pinned(), allocation_limit=limit),
                                                       initial_pool_size=GiB))
pool = rmm.mr.PoolMemoryResource(rmm.mr.LimitingResourceAdaptor(pinned(), allocation_limit=3 * GiB), initial_pool_size=GiB)
bufs = []
try:
    for _ in range(20):
        bufs.append(rmm.DeviceBuffer(size=200_000_000, mr=pool))
except MemoryError as e:
    print("cap 3 GiB:", len(bufs), "buffers, then", type(e).__name__, str(e)[:160])
print("cap pool", f"{pool.pool_size():,}", flush=True)
del bufs, pool
for gb in (1, 4, 16):
    t = time.perf_counter(); b = rmm.DeviceBuffer(size=gb * GiB, mr=pinned()); dt = time.perf_counter() - t
    print("cudaHostAlloc", gb, "GiB", f"{dt:.3f}s", f"{gb * GiB / dt / 1e9:.1f} GB/s", flush=True); del b
