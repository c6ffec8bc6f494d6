"""Tests use the same deployment helper as the benchmarks."""

from loadtests.stack import MODEL, Stack, add_gateway, config, start_stack

__all__ = ["MODEL", "Stack", "add_gateway", "config", "start_stack"]
