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
#: Bytes of each buffer the pools serve.
BUFFER = 200_000_000


def timed(make):
    """``make()`` and the seconds it took."""
    started = time.perf_counter()
    made = make()
    return made, time.perf_counter() - started


def run(name, make_pool, n=20):
    """Make a pool with ``make_pool``, take ``n`` buffers from it; print each step's seconds and the pool's size."""
    pool, made_s = timed(make_pool)
    bufs, times = [], []
    for _ in range(n):
        buf, seconds = timed(lambda: rmm.DeviceBuffer(size=BUFFER, mr=pool))
        bufs.append(buf)
        times.append(seconds)
    print(name, f"create {made_s:.3f}s allocs", [round(x, 3) for x in times],
          f"sum {sum(times):.3f}s pool {pool.pool_size():,}", flush=True)


def limiting_pool(limit):
    """A pool with no maximum over pinned memory under a ``LimitingResourceAdaptor`` at ``limit`` bytes."""
    upstream = rmm.mr.LimitingResourceAdaptor(rmm.mr.PinnedHostMemoryResource(), allocation_limit=limit)
    return rmm.mr.PoolMemoryResource(upstream, initial_pool_size=GiB)


def main():
    limit = 64 * GiB
    run("max-pool", lambda: rmm.mr.PoolMemoryResource(rmm.mr.PinnedHostMemoryResource(), initial_pool_size=GiB,
                                                      maximum_pool_size=limit))
    run("limiting-pool", lambda: limiting_pool(limit))
    pool, bufs = limiting_pool(3 * GiB), []
    try:
        for _ in range(20):
            bufs.append(rmm.DeviceBuffer(size=BUFFER, mr=pool))
    except MemoryError as e:
        print("cap 3 GiB:", len(bufs), "buffers, then", type(e).__name__, str(e)[:160])
    print("cap pool", f"{pool.pool_size():,}", flush=True)
    del bufs, pool
    for gb in (1, 4, 16):
        buf, seconds = timed(lambda: rmm.DeviceBuffer(size=gb * GiB, mr=rmm.mr.PinnedHostMemoryResource()))
        print("cudaHostAlloc", gb, "GiB", f"{seconds:.3f}s", f"{gb * GiB / seconds / 1e9:.1f} GB/s", flush=True)
        del buf


if __name__ == "__main__":
    main()
