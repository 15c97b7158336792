"""The faithproxy web server: settings, request policy, routers, the chain session, metrics, traces."""
