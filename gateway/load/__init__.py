"""Backend load: the monitor that scrapes each engine's metrics (parsed by gateway.wire) and
health, and Triton's model readiness."""
