"""Live drills: fault, overload and poison runs against a started ``Stack``, and a
throwaway Redis. The reliability tests (``tests/services``) and their experiment scripts
(``infra/experiments``) both call them, so an experiment never imports a test (issue 32
item 3; docs/reliability.md has what each drill measured).

* ``faults.run_fault``: an executor hangs or dies, or its scheduler dies, under load;
* ``overload.run_overload``: Poisson arrivals at a multiple of capacity;
* ``poison.run_poison``: poison inputs beside a normal stream;
* ``h2.send_oversized``: a frame-level client that declares a huge gRPC message;
* ``redis_server.ThrowawayRedis``: a ``redis-server`` of our own that a drill may kill.
"""
