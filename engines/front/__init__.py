"""vLLM's OpenAI-compatible front, shared by the engines (the simulator and `tiergate hf`).

`schemas`: the request bodies; `wire`: vLLM's error JSON, body parsing, SSE framing and
client-disconnect handling; `metrics`: vLLM's Prometheus metric names, labels and buckets.
"""
