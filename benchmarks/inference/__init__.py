"""Inference services under request traces: cold starts, time to first token, GPU-seconds,
quota, and the gateway's overhead.

``python -m benchmarks.inference [--quick] [--load-seconds 5 20 60] [--traces bursty diurnal]
[--strategies reactive warm-pool fixed-min forecast] [--duration S] [--day-seconds S]
[--history-days N] [--seed N] [--no-overhead] [--compare TREE] [--json OUT]``

One real ``gpuportal serve`` (SQLite, simulated 8-GPU nodes, the local backend: every replica
a real test-engine process with ``--load-seconds``). Per trace × load time × strategy a tenant
of its own with one service, its quota sized to the strategy's bounds; all of them deployed,
brought to rest (``settle``), then every trace replayed at once through the gateway with the
tenant's user token (``replay``). Strategies: ``reactive`` (min 0), ``warm-pool`` (min 0,
warm 1), ``fixed-min`` (min 1), each with max 2 and the portal's autoscaler on concurrency,
and ``forecast`` (min 0, its warm pool sized by the portal's pre-warm planner from
``--history-days`` simulated days before the replay and the arrivals seen; ``strategies``);
forecast is compared with reactive per trace and load time, and each cell's requests that
met a load are broken down by cause (``breakdown``). Then the gateway's
overhead: the same requests at 200/s straight to a fast replica and through the gateway
(``overhead``); ``--compare TREE`` starts a second portal from another source tree (an
export of main) and measures its gateway in the same alternating blocks, side by side.
Prints Markdown tables; ``--json`` writes everything.
"""
