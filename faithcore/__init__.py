"""The pure core of faithproxy: steps, verdicts, the step segmenter, step typing, chain records, errors.

Nothing here does I/O or imports a web framework, so the server, the detectors and the benchmarks can
all import it (it sits below `clients/` in the one-way import order).
"""
