"""Local servers that stand in for real parts in tests, the demo and the benchmarks."""
