"""HTTP routes: thin, each calls one service function."""
