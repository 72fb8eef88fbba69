"""The variants' names: one line each for the reports, and short column labels."""

VARIANTS: dict[str, str] = {
    "a": "(a) our Prefect flow: gpu_tasks, GPU results between tasks",
    "a-deferred": "(a) deferred: (a) with every step but the last deferred (gpu_task(defer=True)), "
    "the pipeline fused into the last task's one engine call",
    "h": "(h) Prefect's floor: plain Prefect tasks making (b)'s engine calls",
    "b": "(b) bare engine, chained engine.execute()",
    "c": "(c) bare engine, one fused query",
    "d": "(d) bare engine, collect() + .lazy() host round trips",
    "e": "(e) polars on the CPU, fused query",
    "g": "(g) the peer: plain Prefect tasks, collect(engine='gpu'), DataFrames between tasks, "
    "Prefect's default cache policy",
    "g-nocache": "(g) with cache_policy=NO_CACHE",
}
SHORT = {
    "a": "(a) ours",
    "a-deferred": "(a) deferred",
    "h": "(h) plain tasks",
    "b": "(b) chained",
    "c": "(c) fused",
    "d": "(d) round trips",
    "e": "(e) CPU",
    "g": "(g) peer",
    "g-nocache": "(g) NO_CACHE",
}
