"""The stages of the request path, outermost first: Record, Trace, Translate, Authenticate,
Accept | Classify, Limit, Degrade, Cache, Failover (or Explain, the dry run). See stack.py."""
