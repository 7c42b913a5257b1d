"""Inbound APIs other than OpenAI chat (Anthropic Messages, OpenAI Responses).

Each is translated to the gateway's internal OpenAI chat request, runs the same pipeline as
`/v1/chat/completions` (auth, governance, classification, caching, routing, retries, breakers,
metrics, access log), and its answer (JSON, SSE stream or error) is translated back.
"""
