"""The routes. The four model doors (chat, completions, responses, messages): one serving base class
(serving.py) and a translation per API, off mode's pure-ASGI path (off.py), the request bodies and the
OpenAPI schema; and the operator's routes (reports, report pages, health and metrics).

May import: settings, protocol, observe, state, admission, runtime, chain.
"""
