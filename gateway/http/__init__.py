"""The client-facing HTTP server: uvicorn + uvloop + httptools, with the limits a public server needs.

- :mod:`gateway.http.limits`: the limits (from Settings) and the process's open-file limit;
- :mod:`gateway.http.protocol`: uvicorn's httptools protocol with head-size, timeout and
  connection-cap guards, close-delimited HTTP/1.0 streams, half-close support;
- :mod:`gateway.http.fds`: noticing and logging file-descriptor exhaustion;
- :mod:`gateway.http.config`: the one uvicorn config used by ``gateway serve`` and the tests.

See docs/hardening.md.
"""
