"""Python peers of `cargo xtask bench dispatch` (launched once per round by
crates/strata-dist/benches/dispatch.rs).

The same two measurements as strata's L3 round trip and chain, with what a Python user
would pick to dispatch work to other processes:

- ``pipe``: ``multiprocessing.Pipe`` to one child process that answers each message
  (a no-op task: send the argument, receive the result);
- ``pool``: ``multiprocessing.Pool(1).apply(f, (x,))`` of a no-op function;
- ``ray``: ``ray.get(f.remote(x))`` of a no-op remote function on a local Ray instance
  (``ray.init(num_cpus=2)``, bound to 127.0.0.1); its chain passes each task's ObjectRef to the next, so Ray
  resolves the dependency itself, and ``ray.get`` waits for the last.

For ``pipe`` and ``pool`` a chain is N tasks each started when the previous one finished
(neither has dependencies between tasks), which is N round trips.

Usage: ``python dispatch_peers.py pipe|pool|ray RTT_RUNS CHAIN CHAIN_REPS``. After
warm-up, prints ``rtt_us <median µs per round trip, each timed on its own>`` and
``chain_us <median over CHAIN_REPS chains of µs per task>``.
"""

import statistics
import sys
import time


def noop(x):
    return x


def serve(conn):
    while True:
        x = conn.recv()
        if x is None:
            return
        conn.send(x)


def measure(call, chain, rtt_runs, chain_len, chain_reps):
    for i in range(min(rtt_runs, 200)):
        call(i)
    rtt = []
    for i in range(rtt_runs):
        t = time.perf_counter()
        call(i)
        rtt.append(time.perf_counter() - t)
    chains = []
    for _ in range(chain_reps):
        t = time.perf_counter()
        chain(chain_len)
        chains.append((time.perf_counter() - t) / chain_len)
    print("rtt_us %.3f" % (statistics.median(rtt) * 1e6))
    print("chain_us %.3f" % (statistics.median(chains) * 1e6))


def sequential(call):
    def chain(n):
        x = 0
        for _ in range(n):
            x = call(x)
        return x

    return chain


def main():
    which, rtt_runs, chain_len, chain_reps = sys.argv[1], *map(int, sys.argv[2:5])
    if which == "pipe":
        import multiprocessing as mp

        parent, child = mp.Pipe()
        p = mp.Process(target=serve, args=(child,))
        p.start()

        def call(x):
            parent.send(x)
            return parent.recv()

        measure(call, sequential(call), rtt_runs, chain_len, chain_reps)
        parent.send(None)
        p.join()
    elif which == "pool":
        import multiprocessing as mp

        with mp.Pool(1) as pool:

            def call(x):
                return pool.apply(noop, (x,))

            measure(call, sequential(call), rtt_runs, chain_len, chain_reps)
    elif which == "ray":
        import logging

        import ray

        # Everything on the loopback address: the bench sends no traffic off the host.
        ray.init(
            _node_ip_address="127.0.0.1",
            num_cpus=2,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        f = ray.remote(noop)

        def call(x):
            return ray.get(f.remote(x))

        def chain(n):
            ref = f.remote(0)
            for _ in range(n - 1):
                ref = f.remote(ref)
            return ray.get(ref)

        try:
            measure(call, chain, rtt_runs, chain_len, chain_reps)
        finally:
            ray.shutdown()
    else:
        sys.exit("unknown peer %r" % which)


if __name__ == "__main__":
    main()
