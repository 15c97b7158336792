"""What a request passes before it is served, once, whichever door and mode: API keys (auth.py) and
their policies (key_policy.py), the policy headers (policy.py), size, image and token limits and the
concurrency cap (limits.py), the JSON guard, client timeouts (connections.py, client_gone.py) and the
media-URL policy (image_urls.py, media_parts.py); admit.py runs them in order.

May import: settings, protocol, observe, state.
"""
