"""The doors table and each API's wire shapes: which doors there are (path, error format, metric label,
the upstream path they call), their error bodies (OpenAI's or Anthropic's), and the SSE frames.

Owns: doors.py, errors.py, sse.py. May import: settings (and faithcore, clients). Everything else in the
server reads a door from here, so a door's path is written in one product file.
"""
