"""Health, Prometheus metrics, the summary, the dashboard and its static files, the docs page."""
