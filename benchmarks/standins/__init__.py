"""The judge stand-in: a local judge server on both judge wire protocols (judge_server.py), for tests,
the demo and the benchmarks. The fake upstream is faithproxy.testing."""
