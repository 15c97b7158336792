"""The process a server runs in: uvicorn's server and its graceful stop, `--workers N` and the
supervisor that restarts them, the heap trim, and the last-resort 500 in the door's format.

Owns: uvicorn_server.py, workers.py, supervisor.py, heap_trim.py, internal_errors.py. May import:
settings, protocol, observe, admission.
"""
