"""Remote engine: the window (or the CLI) here, the model in an ``attnscope serve`` process.

Design notes
============

Pieces: :mod:`.wire` (messages), :mod:`.server` (``EngineServer``: one Session, one socket),
:mod:`.client` (``RemoteSession``: the Session API over the wire), :mod:`.dispatch`
(``@remotable``: session-level analysis functions that run where the model is).

Transport: ZeroMQ (pyzmq), measured on this machine's loopback (2-core, shared, Python 3.11,
median of 15 round trips; the big reply is one 2048 × 2048 float32 map, 16.8 MB; the small one a
30 × 9 float32 table)::

    transport                              big reply    small reply
    pyzmq 27.3 ROUTER/DEALER, zero-copy    15.8-20 ms     0.05-0.10 ms
    grpcio 1.85 (generic bytes method)     12.2-14 ms     0.34 ms
    websockets 17.4 (sync API)             40.4-55 ms     0.07-0.15 ms

Why ZeroMQ: the lowest latency for the many small requests a window makes (a step, a sink table,
a snapshot) at the throughput of gRPC for big tiles; multipart messages carry each array's bytes as
its own frame, sent from the numpy buffer and received into one without a copy or a serialisation
pass; a ROUTER socket can send any number of progress messages before the answer (prefill progress,
cancel) without a second channel; heartbeats and the socket monitor (a dropped connection is an
event) come with it; no code generation, no schema files. gRPC's 4 MB default message limit and its
protobuf layer buy nothing when the payload is raw arrays; WebSockets was 2.5× slower on big frames.
ZeroMQ's plain TCP is not encrypted: bind to localhost (the default) and tunnel with SSH
(``ssh -L 8765:localhost:8765 server``), as Jupyter and TensorBoard users do; the token keeps other
local users and anything that reaches an exposed port out.

Arrays: raw little-endian C-order bytes with dtype and shape in the JSON header, as safetensors
lays them out (:mod:`.wire`); never pickle. Compression: zstd level 1 (``zstandard``) on a 2048²
attention map takes ~55 ms to compress and ~40 ms to decompress for a ratio of ~2.2; zlib level 1
took 540 ms + 110 ms (ratio 2.2). So a tile is compressed only when the client has measured a link
slower than 80 MB/s (the break-even: 9 MB saved per ~100 ms of CPU) and the package is installed;
on localhost or a LAN it never is.

``attnscope bench --engine`` on localhost (SmolLM2-135M float32, T = 2048, L3 H4; this 2-core
machine, load average 1.2-1.3, four runs): one head's map in-process 6.2-8.7 ms, remote 13.9-16.8 ms
(1.94-2.63×, target ≤ 2×); the engine's compute of it equals in-process (6.2-6.8 ms) and the rest is
the link: the engine sending a 16.8 MB buffer it holds takes 4.0-7.2 ms here (raw pyzmq between two
processes: 4.3 ms). The sink table costs +1.3 to +5.7 ms (target ≤ 30 ms). What made the engine's
compute slower than in-process is gone: :mod:`.wire`'s recursive closures, a reference cycle holding
each message's buffers until a garbage collection (fresh pages for every map). libgomp's default
busy-wait, a torch worker spinning on a core through each send, is bounded (:mod:`attnscope.core.openmp`,
as in every attnscope process). The remote map is bit-identical to
in-process in every run (``tests/integration/test_remote.py`` checks weights, logits and sink tables for SmolLM2
and a tiny Qwen3).

``attnscope serve --ray [ADDRESS]`` (:mod:`.ray_engine`): Ray places one actor with the GPUs and
CPUs asked for; the actor runs the same EngineServer on a thread, so clients connect to the node's
address as to any engine and nothing goes through Ray's object store. Ray's default of
``OMP_NUM_THREADS = num_cpus`` matters: torch's CPU float sums depend on the thread count, so CPU
numbers are bit-identical to in-process only at the same count (``--ray-cpus``; the test sets it).
Ray is optional and not in CI (its tests skip without it).

The window's model picker lists the engine's models (``op_models``, with ``op_free_memory`` for its
Fit column), and Head roles and Experiments run there (``role_table`` and ``run_experiments`` are
``@remotable``; role labels travel as a string array, :mod:`.wire`).

Compare's run B is a second session on the engine, next to A (:mod:`attnscope.core.analysis.compare_run_b`):
``run_b`` loads, runs and compares it there and returns the ``CompareResult`` (JSON fields + raw
arrays), and the maps, tiles and rows are ``b_maps``/``b_overview`` calls on the B held there. Moving
B's trace to the window instead would cost the whole KV cache and q rows over the link; the engine
holds at most A + B (``op_load`` drops B before it loads another model).
"""
