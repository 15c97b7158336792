"""What a request passes before it is served, once, whichever door and mode: API keys (auth.py) and
their policies (key_policy.py), the policy headers (policy.py), size, image and token limits and the
concurrency cap (limits.py), the JSON guard, client timeouts (connections.py, client_gone.py) and the
media-URL policy (image_urls.py, media_parts.py); admit.py runs them in order. The routing key that
keeps every upstream call of the request on one replica (affinity.py) is set here too, as pure ASGI in
front of every mode, off included.

It reads the app's resources through `admit.AdmissionState`, what server/state.py's AppState (a room
above, which holds admission's key policies) hands it. May import: settings, protocol, observe.
"""
