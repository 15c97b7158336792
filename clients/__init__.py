"""Outbound clients: the vLLM generator, judge backends. Never import server/."""
