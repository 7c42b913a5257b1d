"""Provider adapters: each provider `type:` of the policy maps to one (see base.py; the
registry of every adapter is registry.py)."""
