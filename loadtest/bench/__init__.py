"""The proxy benchmark's parts (entry point: loadtest/bench_proxy.py).

  scenarios.py  targets, request bytes, response checks, the cases A-D
  loadgen.py    the load generator: HTTP/1.1 connections on asyncio + httptools, timings, CPU per process
  targets.py    the processes under test: stub, gateway, Python floor, nginx (install, config, pinning)
  profiling.py  py-spy on the gateway and a summary of where its time goes
  report.py     tables, ratios, machine facts, JSON helpers
"""
