"""Load testing an OpenAI-compatible server: a staircase of rising load, TTFT/TPOT P99s, the knee.

config (validated settings, engine/API registries) -> client (SSE streaming, one record per
request) -> runner (closed/open-loop staircase) -> stats (pure numbers) -> report / plot / compare.
"""
