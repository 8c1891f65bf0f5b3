"""Service functions: the logic behind each route. They flush, never commit."""
