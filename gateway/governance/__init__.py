"""Many tenants on one gateway: managed keys, rate limits, budgets and spend."""
