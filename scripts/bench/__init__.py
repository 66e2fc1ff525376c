"""The benchmark scripts' shared parts (scripts/ is no package: each scripts/bench_*.py puts
its own folder on sys.path and imports `bench.…`): one way to start and stop a server process
(server.py), process memory (processes.py), the soak's shared parts (soak.py), and
scripts/bench_agents.py's workload, runs, statistics and reports."""
