"""Cross-cutting observability: structured logs (tracing and metrics join here)."""
