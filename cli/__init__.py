"""The `abps` command line (typer). Thin: parses, validates, calls etl / federation / abps."""
