"""The admin API (one auth guard, one mount) and the command-line client that drives it."""
