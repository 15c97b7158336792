"""The routes. The four model doors, one module each (chat.py, completions.py, responses.py,
messages.py: a door's body parser, its translation to chat, its renderer, its wires, its OpenAPI and its
`Door`) listed in table.py; what they share: one serving object (serving.py `DoorServing`: the chain
session, the accounting, off mode), one route per door (routes.py), off mode's pure-ASGI path (off.py),
the body, capture and OpenAPI helpers (bodies.py, captured.py, schema.py); and the operator's routes
(reports, report pages, health and metrics).

May import: settings, protocol, observe, state, admission, runtime, chain.
"""
