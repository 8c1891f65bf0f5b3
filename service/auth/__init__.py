"""Who may do what: API keys, roles, the ``allow`` declarations on routes."""
