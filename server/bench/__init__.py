"""``livesight bench``: benchmarks that print numbers and ratios against a baseline of the same run.

One module per bench: ``ttft`` (and ``conversation``, its ``--conversation``), ``intake``,
``load`` (and ``flood``, its ``--flood``), ``storm``, ``voice``, ``engine``, ``fuzz``. What they
share is apart, each importing none of the benches: ``footage`` (the pictures streamed; PIL,
numpy and PyAV only, for the tests too), ``spoken`` (spoken questions), ``process`` (/proc
readers), ``busy`` (processes that keep cores busy, ``--busy``), ``served`` (the server under
test's flags and waits) and ``latency``.
"""
