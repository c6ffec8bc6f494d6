"""The `tiergate` command, composed above the gateway, the engines and the load tests."""
