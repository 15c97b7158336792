"""Speed and load benchmarks: scripts that print figures (never timed test assertions)."""
