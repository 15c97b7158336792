"""What an operator watches: Prometheus metrics (one module), OpenTelemetry spans and events, the trace
file, reports (in memory or Redis) and their HTML pages, and `finish_request`, where every request ends.

Owns: metrics.py, step_metrics.py, otel.py, traces.py, summary.py, finish.py, reports.py,
reports_redis.py, report_page.py, templates/. May import: settings, protocol. It knows a request only
by the fields it records (traces.RecordedRequest), never admission's classes.
"""
