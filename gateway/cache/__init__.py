"""Response caches: exact (hash of the request) and semantic (meaning of the last question)."""
